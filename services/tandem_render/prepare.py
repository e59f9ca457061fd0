"""Screen a render request before vLLM sees it: media parts out, limits and allowlists in.

Every media reference (URL or raw bytes) is replaced by a ``tandem-media:<n>`` token whose
bytes this service fetches itself, so vLLM never touches the network and never parses a
megabyte data URL through pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tandem_http import (
    BadRequest,
    MmEmbedsDisabled,
    PromptTooLong,
    TokenOutOfVocabulary,
    VllmBadRequest,
)

from .embeds import EmbedsSpec, decode_embeds_part

__all__ = [
    "MEDIA_URL_PREFIX",
    "EmbedsRef",
    "ItemLimit",
    "MediaRef",
    "PreparedChat",
    "PreparedCompletion",
    "ProcessorFacts",
    "RequestLimits",
    "prepare_chat",
    "prepare_completion",
    "prepare_messages",
    "prepare_responses",
]

MEDIA_URL_PREFIX = "tandem-media:"
"""The URL scheme of the tokens that replace media parts; they name prefetched bytes."""

# Content parts passed through untouched. Everything else is refused: e.g. "image_pil" is for
# in-process callers only. Embedding parts are decoded here (safetensors; vLLM's own reader
# would torch.load() caller bytes) and reach vLLM only as tokens naming checked tensors.
_TEXT_PARTS = frozenset({"text", "input_text", "refusal", "thinking"})
_MEDIA_PARTS = {
    "image_url": "image",
    "video_url": "video",
    "audio_url": "audio",
    "image": "image",
    "video": "video",
    "audio": "audio",
}
_BYTES_PARTS = {"image_bytes": "image", "video_bytes": "video", "audio_bytes": "audio"}
_EMBEDS_PARTS = {"image_embeds": "image"}
_URL_PARTS = {"image": "image_url", "video": "video_url", "audio": "audio_url"}
"""The part each modality is handed to vLLM as (its URL names the prefetched bytes)."""
_AUDIO_FORMAT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,15}")
"""An ``input_audio`` format: it becomes a data URL's media type, as vLLM builds it."""


_FPS_BOUND = 240
"""Largest ``fps`` a request may ask for; frames sampled are capped by ``num_frames``'s bound."""


@dataclass(frozen=True)
class ItemLimit:
    """How many items of one modality a prompt may hold, as vLLM's processor derives it."""

    allowed: int
    """The limit in force: ``--limit-mm-per-prompt`` (vLLM's default 999) capped by the model."""
    supported: int | None = None
    """The most the model itself takes (None: no limit of its own)."""

    @property
    def most(self) -> int:
        """The most items a prompt may hold."""
        return self.allowed if self.supported is None else min(self.supported, self.allowed)


@dataclass(frozen=True)
class ProcessorFacts:
    """What the model's own processor allows, read from its configuration (None: not stated)."""

    max_pixels: int | None = None
    """The image processor's largest resize target (Qwen-VL's ``max_pixels``)."""

    pixels_per_token: int | None = None
    """Pixels behind one placeholder token ((patch size x merge size) squared)."""

    max_frames: int | None = None
    """The video processor's most sampled frames."""

    embeds: Mapping[str, EmbedsSpec] = field(default_factory=dict)
    """By modality: how the model takes precomputed embeddings (empty: it takes none here)."""

    item_limits: Mapping[str, ItemLimit] = field(default_factory=dict)
    """By modality, the most items a prompt may hold (a modality left out: none)."""


@dataclass(frozen=True)
class RequestLimits:
    """The per-request bounds screened here."""

    item_limits: Mapping[str, ItemLimit]
    """By modality (left out: the model takes none), counted before any media is fetched."""
    mm_kwargs_allowlist: frozenset[str]
    max_kwargs_pixels: int
    """Largest ``min_pixels`` / ``max_pixels`` a request may ask for."""
    max_kwargs_frames: int = 768
    """Largest ``num_frames`` a request may ask for."""
    pixels_per_token: int | None = None
    """From the processor: lets ``min_pixels`` be checked against the context before work."""
    max_model_len: int | None = None
    embeds_enabled: bool = False
    """Whether embedding content parts are accepted at all (``--enable-mm-embeds``)."""
    embeds: Mapping[str, EmbedsSpec] = field(default_factory=dict)
    """By modality, what an embedding part must look like for this model."""

    def most_items(self, modality: str) -> int:
        """The most items of ``modality`` a prompt may hold (0: the model takes none)."""
        limit = self.item_limits.get(modality)
        return 0 if limit is None else limit.most

    @classmethod
    def build(
        cls,
        *,
        allowlist: frozenset[str],
        facts: ProcessorFacts,
        max_model_len: int | None,
        max_kwargs_pixels: int | None = None,
        max_kwargs_frames: int | None = None,
        max_image_pixels: int,
        enable_mm_embeds: bool = False,
        limit_mm_per_prompt: Mapping[str, int] | None = None,
    ) -> RequestLimits:
        """Operator bounds where given, else the model's own: a request can ask for less work
        than the model's defaults, never more. ``limit_mm_per_prompt``: the item limits the
        operator set, capped by what the model supports (vLLM's ``allowed_mm_limits``)."""
        pixels = max_kwargs_pixels or facts.max_pixels or max_image_pixels
        user = limit_mm_per_prompt or {}
        return cls(
            item_limits={
                modality: ItemLimit(user.get(modality, limit.allowed), limit.supported)
                for modality, limit in facts.item_limits.items()
            },
            mm_kwargs_allowlist=allowlist,
            max_kwargs_pixels=min(pixels, max_image_pixels),
            max_kwargs_frames=max_kwargs_frames or facts.max_frames or 768,
            pixels_per_token=facts.pixels_per_token,
            max_model_len=max_model_len,
            embeds_enabled=enable_mm_embeds,
            embeds=facts.embeds,
        )


@dataclass(frozen=True)
class MediaRef:
    """One media item of a request: where its bytes come from and the token that names it."""

    token: str
    modality: str
    url: str | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class EmbedsRef:
    """One embedding part: its checked tensors and the token prefix that names them."""

    token: str
    modality: str
    tensors: Mapping[str, np.ndarray]

    def urls(self) -> dict[str, str]:
        """Tensor name -> the token vLLM's embedding fetch is handed for it."""
        return {name: f"{self.token}/{name}" for name in self.tensors}


@dataclass
class PreparedChat:
    body: dict[str, Any]
    media: list[MediaRef] = field(default_factory=list)
    embeds: list[EmbedsRef] = field(default_factory=list)

    def embed_tensors(self) -> dict[str, np.ndarray]:
        """Token -> tensor, for every embedding part (what vLLM's embedding fetch may serve)."""
        return {ref.urls()[k]: t for ref in self.embeds for k, t in ref.tensors.items()}


@dataclass
class PreparedCompletion:
    body: dict[str, Any]
    media: list[list[MediaRef] | None] | None = None
    """Per prompt, its media items (from ``images``, ``videos`` and ``audios``; each
    modality's in the order given), or None for a prompt without any; None: no field given."""


def _media_ref(counter: list[int], modality: str, source: Any, where: str) -> MediaRef:
    token = f"{MEDIA_URL_PREFIX}{counter[0]}"
    counter[0] += 1
    if isinstance(source, (bytes, bytearray, memoryview)):
        return MediaRef(token, modality, data=bytes(source))
    if isinstance(source, dict):
        source = source.get("url")
    if not isinstance(source, str) or not source:
        raise BadRequest(f"{where}: expected a media URL or bytes", param=where)
    return MediaRef(token, modality, url=source)


def _check_counts(refs: Sequence[MediaRef | EmbedsRef], limits: RequestLimits) -> None:
    """vLLM's own count rule (``validate_num_items``), applied before any media is fetched
    and refused in its words, type and ``param``, as ``vllm serve`` refuses the prompt."""
    counts: dict[str, int] = {}
    for ref in refs:  # in the prompt's order: vLLM refuses the first item past a limit
        count = counts[ref.modality] = counts.get(ref.modality, 0) + 1
        item_limit = limits.item_limits.get(ref.modality, ItemLimit(0, 0))
        if count > item_limit.most:
            message = f"At most {item_limit.most} {ref.modality}(s) may be provided in one prompt."
            if item_limit.supported is None or count <= item_limit.supported:
                message += " Set `--limit-mm-per-prompt` to increase this limit."
            raise VllmBadRequest(message, param=ref.modality)


def _input_audio_ref(counter: list[int], source: Any, where: str) -> MediaRef:
    """An ``input_audio`` part's ``{data, format}``, as the data URL vLLM itself makes of it."""
    if not isinstance(source, dict):
        raise BadRequest(
            f"{where}.input_audio must be an object with data and format", param="messages"
        )
    data, fmt = source.get("data"), source.get("format")
    if not isinstance(data, str) or not data:
        raise BadRequest(f"{where}.input_audio.data must be base64 text", param="messages")
    if not isinstance(fmt, str) or not _AUDIO_FORMAT.fullmatch(fmt):
        raise BadRequest(
            f"{where}.input_audio.format must be a short name such as wav or mp3",
            param="messages",
        )
    return _media_ref(counter, "audio", f"data:audio/{fmt.lower()};base64,{data}", where)


def _check_common(body: Mapping[str, Any], limits: RequestLimits) -> None:
    if body.get("media_io_kwargs"):
        raise BadRequest("media_io_kwargs is not accepted", param="media_io_kwargs")
    kwargs = body.get("mm_processor_kwargs")
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise BadRequest("mm_processor_kwargs must be an object", param="mm_processor_kwargs")
    for key, value in kwargs.items():
        if key not in limits.mm_kwargs_allowlist:
            allowed = ", ".join(sorted(limits.mm_kwargs_allowlist))
            raise BadRequest(
                f"mm_processor_kwargs.{str(key)[:40]} is not allowed (allowed: {allowed})",
                param="mm_processor_kwargs",
            )
        bound = _kwarg_bound(key, limits)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= bound:
            raise BadRequest(
                f"mm_processor_kwargs.{key} must be a number in (0, {bound}]",
                param="mm_processor_kwargs",
            )


def _kwarg_bound(key: str, limits: RequestLimits) -> int:
    if key.endswith("pixels"):
        return limits.max_kwargs_pixels
    if key.endswith("frames"):
        return limits.max_kwargs_frames
    if key == "fps":
        return _FPS_BOUND
    return 10_000  # an operator-allowed key we know nothing of: still a bounded number


def _check_implied_grid(body: Mapping[str, Any], images: int, limits: RequestLimits) -> None:
    """Refuse, before any pixel is processed, images that ``min_pixels`` would enlarge past the
    context: each one becomes at least ``min_pixels / pixels_per_token`` placeholder tokens."""
    kwargs = body.get("mm_processor_kwargs") or {}
    min_pixels = kwargs.get("min_pixels")
    if not images or not min_pixels or not limits.pixels_per_token or not limits.max_model_len:
        return
    at_least = images * int(min_pixels // limits.pixels_per_token)
    if at_least > limits.max_model_len:
        raise PromptTooLong(
            f"mm_processor_kwargs.min_pixels={int(min_pixels)} makes {images} image(s) at least "
            f"{at_least} tokens, more than the context ({limits.max_model_len})",
            param="mm_processor_kwargs",
        )


def _messages_of(body: Any, limits: RequestLimits) -> list[Any]:
    """The ``messages`` of a chat or Messages body, once its common fields are checked."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_common(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    return messages


def prepare_chat(body: Any, limits: RequestLimits) -> PreparedChat:
    """Validate the chat request's shape and pull its media out into ``MediaRef``s."""
    messages = _messages_of(body, limits)
    counter = [0]
    refs: list[MediaRef] = []
    embeds: list[EmbedsRef] = []
    out_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", param="messages")
        if not isinstance(message.get("role"), str):
            # vLLM's request model also takes harmony Message objects (an "author" instead of
            # a "role"), which its chat parser then fails on with a TypeError.
            raise BadRequest(f"messages[{i}].role must be a string", param="messages")
        content = message.get("content")
        if not isinstance(content, list):
            out_messages.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            parts.append(_screen_part(part, where, counter, refs, embeds, limits))
        out_messages.append({**message, "content": parts})
    _check_counts([*refs, *embeds], limits)
    mixed = {r.modality for r in refs} & {e.modality for e in embeds}
    if mixed:
        kind = sorted(mixed)[0]
        # vLLM's chat parser refuses it too; said here, with the part names.
        raise BadRequest(f"{kind} media and {kind}_embeds parts cannot be mixed in one request")
    _check_implied_grid(body, sum(r.modality == "image" for r in refs), limits)
    return PreparedChat(body={**body, "messages": out_messages}, media=refs, embeds=embeds)


def prepare_messages(body: Any, limits: RequestLimits) -> PreparedChat:
    """An Anthropic Messages request: its image blocks (in messages and in tool results) become
    URL sources naming prefetched bytes, as ``prepare_chat`` does for chat parts."""
    messages = _messages_of(body, limits)
    counter = [0]
    refs: list[MediaRef] = []

    def blocks(content: Any, where: str) -> Any:
        if not isinstance(content, list):
            return content
        out = []
        for j, block in enumerate(content):
            at = f"{where}[{j}]"
            if not isinstance(block, dict):
                raise BadRequest(f"{at} must be an object", param="messages")
            kind = block.get("type")
            if kind == "image":
                ref = _anthropic_image_ref(counter, block.get("source"), at)
                refs.append(ref)
                block = {**block, "source": {"type": "url", "url": ref.token}}
            elif kind == "tool_result":
                block = {**block, "content": blocks(block.get("content"), f"{at}.content")}
            elif kind in _ANTHROPIC_MEDIA_BLOCKS:
                raise BadRequest(f"{at}: content block type {kind!r} is not supported")
            out.append(block)
        return out

    out_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", param="messages")
        content = blocks(message.get("content"), f"messages[{i}].content")
        out_messages.append({**message, "content": content})
    _check_counts(refs, limits)
    _check_implied_grid(body, len(refs), limits)
    return PreparedChat(body={**body, "messages": out_messages}, media=refs)


_ANTHROPIC_MEDIA_BLOCKS = frozenset({"document", "search_result", "container_upload"})
"""Blocks that carry files or remote content: not fetched here, so refused."""


def _anthropic_image_ref(counter: list[int], source: Any, where: str) -> MediaRef:
    """An image block's source (``base64`` or ``url``), as the URL vLLM itself makes of it."""
    if not isinstance(source, dict):
        raise BadRequest(f"{where}.source must be an object", param="messages")
    if source.get("type") == "url":
        return _media_ref(counter, "image", source.get("url"), where)
    media_type, data = source.get("media_type", "image/jpeg"), source.get("data")
    if not isinstance(media_type, str) or not isinstance(data, str) or not data:
        raise BadRequest(f"{where}.source needs base64 data and a media_type", param="messages")
    return _media_ref(counter, "image", f"data:{media_type};base64,{data}", where)


_RESPONSES_TEXT_PARTS = frozenset(
    {"input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"}
)


def prepare_responses(body: Any, limits: RequestLimits) -> PreparedChat:
    """A Responses request: its ``input_image`` parts' URLs become tokens naming prefetched
    bytes; other media parts (file ids, files, audio) are refused."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_common(body, limits)
    items = body.get("input")
    if isinstance(items, str):
        return PreparedChat(body=body)
    if not isinstance(items, list) or not items:
        raise BadRequest("input must be text or a non-empty list of items", param="input")
    counter = [0]
    refs: list[MediaRef] = []
    out_items = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", param="input")
        content = item.get("content")
        if not isinstance(content, list):
            out_items.append(item)
            continue
        parts = []
        for j, part in enumerate(content):
            where = f"input[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(part, dict) or not isinstance(kind, str):
                raise BadRequest(f"{where} must be an object with a type", param="input")
            if kind == "input_image":
                if part.get("file_id") is not None:
                    raise BadRequest(f"{where}: file_id images are not supported", param="input")
                ref = _media_ref(counter, "image", part.get("image_url"), where)
                part = {**part, "image_url": ref.token}
            elif kind in _RESPONSES_TEXT_PARTS:
                parts.append(part)
                continue
            else:
                shown = kind[:40]
                raise BadRequest(f"{where}: content part type {shown!r} is not supported")
            refs.append(ref)
            parts.append(part)
        out_items.append({**item, "content": parts})
    _check_counts(refs, limits)
    _check_implied_grid(body, sum(r.modality == "image" for r in refs), limits)
    return PreparedChat(body={**body, "input": out_items}, media=refs)


def _screen_part(
    part: Any,
    where: str,
    counter: list[int],
    refs: list[MediaRef],
    embeds: list[EmbedsRef],
    limits: RequestLimits,
) -> Any:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise BadRequest(f"{where} must be an object", param="messages")
    kind = part.get("type")
    if not isinstance(kind, str):
        raise BadRequest(f"{where}.type must be a string", param="messages")
    if kind in _TEXT_PARTS:
        return part
    if "uuid" in part:
        # A caller-chosen uuid replaces vLLM's content hash: cache entries of one caller
        # would be served to another. Identity always comes from the bytes here.
        raise BadRequest(f"{where}: caller-provided media uuids are not accepted")
    if kind in _EMBEDS_PARTS:
        return _embeds_part(part, kind, where, counter, embeds, limits)
    if kind in _MEDIA_PARTS:
        modality = _MEDIA_PARTS[kind]
        ref = _media_ref(counter, modality, part.get(kind), where)
    elif kind == "input_audio":
        modality = "audio"
        ref = _input_audio_ref(counter, part.get(kind), where)
    elif kind in _BYTES_PARTS:
        modality = _BYTES_PARTS[kind]
        ref = _media_ref(counter, modality, part.get(kind), where)
        if ref.data is None:
            raise BadRequest(f"{where}: {kind} must be raw bytes (msgpack bin)")
    else:
        shown = str(kind)[:40]
        raise BadRequest(f"{where}: content part type {shown!r} is not supported")
    refs.append(ref)
    url_key = _URL_PARTS[modality]
    return {"type": url_key, url_key: {"url": ref.token}}


def _embeds_part(
    part: dict[str, Any],
    kind: str,
    where: str,
    counter: list[int],
    embeds: list[EmbedsRef],
    limits: RequestLimits,
) -> dict[str, Any]:
    modality = _EMBEDS_PARTS[kind]
    if not limits.embeds_enabled:
        raise MmEmbedsDisabled(
            f"{where}: {kind} parts need a server started with --enable-mm-embeds",
            param="messages",
        )
    spec = limits.embeds.get(modality)
    if spec is None:
        raise BadRequest(f"{where}: this model takes no {kind} here", param="messages")
    tensors = decode_embeds_part(part.get(kind), spec, where)
    ref = EmbedsRef(f"{MEDIA_URL_PREFIX}{counter[0]}", modality, tensors)
    counter[0] += 1
    embeds.append(ref)
    # vLLM's dict form: each string is fetched through the media connector, which serves
    # exactly these tokens (media_connector.PrefetchedMediaConnector).
    return {"type": kind, kind: ref.urls()}


_COMPLETION_MEDIA = {"images": "image", "videos": "video", "audios": "audio"}
"""Our completion fields: one list (or null) per prompt of that modality's media."""


def prepare_completion(body: Any, limits: RequestLimits, vocab_size: int) -> PreparedCompletion:
    """Validate a completion request; token ids are checked against the vocabulary and never
    re-tokenized; ``images``, ``videos`` and ``audios`` (ours) attach media to each prompt,
    one list (or null) per prompt, each item a URL or raw bytes, as chat's parts are."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_common(body, limits)
    prompt = body.get("prompt")
    prompts = _prompt_list(prompt)
    for i, p in enumerate(prompts):
        if isinstance(p, list):
            _check_token_ids(p, vocab_size, f"prompt[{i}]")
    rest = {k: v for k, v in body.items() if k not in _COMPLETION_MEDIA}
    given = {name: body[name] for name in _COMPLETION_MEDIA if body.get(name) is not None}
    if not given:
        return PreparedCompletion(body=rest)
    counter = [0]
    per_prompt: list[list[MediaRef]] = [[] for _ in prompts]
    for name, entries in given.items():
        modality = _COMPLETION_MEDIA[name]
        if not isinstance(entries, list) or len(entries) != len(prompts):
            raise BadRequest(
                f"{name} must be a list with one entry (a list or null) per prompt", param=name
            )
        for i, entry in enumerate(entries):
            if entry is None:
                continue
            if not isinstance(entry, list):
                raise BadRequest(f"{name}[{i}] must be a list of {name} or null", param=name)
            per_prompt[i] += [
                _media_ref(counter, modality, src, f"{name}[{i}][{j}]")
                for j, src in enumerate(entry)
            ]
    for refs in per_prompt:
        _check_counts(refs, limits)
        _check_implied_grid(body, sum(r.modality == "image" for r in refs), limits)
    return PreparedCompletion(body=rest, media=[refs or None for refs in per_prompt])


def _prompt_list(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [prompt]
        if all(isinstance(p, (str, list)) for p in prompt):
            return prompt
    raise BadRequest(
        "prompt must be text, token ids, or a non-empty list of either", param="prompt"
    )


def _check_token_ids(ids: list[Any], vocab_size: int, where: str) -> None:
    if not ids:
        raise BadRequest(f"{where} is empty", param="prompt")
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            shown = str(t)[:24]
            raise TokenOutOfVocabulary(
                f"{where}: token id {shown} is outside the vocabulary (size {vocab_size})",
                param="prompt",
            )
