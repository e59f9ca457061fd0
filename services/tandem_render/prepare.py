"""Screen a render request before vLLM sees it: media parts out, limits and allowlists in.

Every media reference (URL or raw bytes) is replaced by a ``tandem-media:<n>`` token whose
bytes this service fetches itself, so vLLM never touches the network and never parses a
megabyte data URL through pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem_http import BadRequest, TokenOutOfVocabulary, TooManyItems

__all__ = [
    "MEDIA_URL_PREFIX",
    "MediaRef",
    "PreparedChat",
    "PreparedCompletion",
    "RequestLimits",
    "prepare_chat",
    "prepare_completion",
]

MEDIA_URL_PREFIX = "tandem-media:"
"""The URL scheme of the tokens that replace media parts; they name prefetched bytes."""

# Content parts passed through untouched. Everything else is refused: e.g. "image_embeds"
# would make vLLM torch.load() caller bytes, and "image_pil" is for in-process callers only.
_TEXT_PARTS = frozenset({"text", "input_text", "refusal", "thinking"})
_MEDIA_PARTS = {"image_url": "image", "video_url": "video", "image": "image", "video": "video"}
_BYTES_PARTS = {"image_bytes": "image", "video_bytes": "video"}


@dataclass(frozen=True)
class RequestLimits:
    """The per-request bounds screened here."""

    max_images: int
    max_videos: int
    mm_kwargs_allowlist: frozenset[str]
    max_image_pixels: int


@dataclass(frozen=True)
class MediaRef:
    """One media item of a request: where its bytes come from and the token that names it."""

    token: str
    modality: str
    url: str | None = None
    data: bytes | None = None


@dataclass
class PreparedChat:
    body: dict[str, Any]
    media: list[MediaRef] = field(default_factory=list)


@dataclass
class PreparedCompletion:
    body: dict[str, Any]
    images: list[list[MediaRef] | None] | None = None


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


def _check_counts(refs: list[MediaRef], limits: RequestLimits) -> None:
    images = sum(r.modality == "image" for r in refs)
    videos = sum(r.modality == "video" for r in refs)
    if images > limits.max_images:
        raise TooManyItems(f"{images} images in one prompt; the limit is {limits.max_images}")
    if videos > limits.max_videos:
        raise TooManyItems(f"{videos} videos in one prompt; the limit is {limits.max_videos}")


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
        bound = limits.max_image_pixels if key.endswith("pixels") else 10_000
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= bound:
            raise BadRequest(
                f"mm_processor_kwargs.{key} must be a number in (0, {bound}]",
                param="mm_processor_kwargs",
            )


def prepare_chat(body: Any, limits: RequestLimits) -> PreparedChat:
    """Validate the chat request's shape and pull its media out into ``MediaRef``s."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_common(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    counter = [0]
    refs: list[MediaRef] = []
    out_messages = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", param="messages")
        content = message.get("content")
        if not isinstance(content, list):
            out_messages.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            parts.append(_screen_part(part, where, counter, refs))
        out_messages.append({**message, "content": parts})
    _check_counts(refs, limits)
    return PreparedChat(body={**body, "messages": out_messages}, media=refs)


def _screen_part(part: Any, where: str, counter: list[int], refs: list[MediaRef]) -> Any:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise BadRequest(f"{where} must be an object", param="messages")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return part
    if "uuid" in part:
        # A caller-chosen uuid replaces vLLM's content hash: cache entries of one caller
        # would be served to another. Identity always comes from the bytes here.
        raise BadRequest(f"{where}: caller-provided media uuids are not accepted")
    if kind in _MEDIA_PARTS:
        modality = _MEDIA_PARTS[kind]
        ref = _media_ref(counter, modality, part.get(kind), where)
    elif kind in _BYTES_PARTS:
        modality = _BYTES_PARTS[kind]
        ref = _media_ref(counter, modality, part.get(kind), where)
        if ref.data is None:
            raise BadRequest(f"{where}: {kind} must be raw bytes (msgpack bin)")
    else:
        shown = str(kind)[:40]
        raise BadRequest(f"{where}: content part type {shown!r} is not supported")
    refs.append(ref)
    url_key = "image_url" if modality == "image" else "video_url"
    return {"type": url_key, url_key: {"url": ref.token}}


def prepare_completion(body: Any, limits: RequestLimits, vocab_size: int) -> PreparedCompletion:
    """Validate a completion request; token ids are checked against the vocabulary and never
    re-tokenized; ``images`` (ours) attaches a list of images to each prompt."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_common(body, limits)
    prompt = body.get("prompt")
    prompts = _prompt_list(prompt)
    for i, p in enumerate(prompts):
        if isinstance(p, list):
            _check_token_ids(p, vocab_size, f"prompt[{i}]")
    images = body.get("images")
    rest = {k: v for k, v in body.items() if k != "images"}
    if images is None:
        return PreparedCompletion(body=rest)
    if not isinstance(images, list) or len(images) != len(prompts):
        raise BadRequest(
            "images must be a list with one entry (a list or null) per prompt", param="images"
        )
    counter = [0]
    per_prompt: list[list[MediaRef] | None] = []
    for i, entry in enumerate(images):
        if entry is None:
            per_prompt.append(None)
            continue
        if not isinstance(entry, list):
            raise BadRequest(f"images[{i}] must be a list of images or null", param="images")
        refs = [
            _media_ref(counter, "image", src, f"images[{i}][{j}]") for j, src in enumerate(entry)
        ]
        _check_counts(refs, limits)
        per_prompt.append(refs or None)
    return PreparedCompletion(body=rest, images=per_prompt)


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
