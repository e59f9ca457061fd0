"""The render service's logic, independent of HTTP: screen, fetch media, render, cache items."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import blake3
import msgspec

from tandem_http import BadRequest, Slot
from tandem_wire import GenerateRequest, WireFormat, decode_document

from .budget import (
    RGB_BYTES,
    MediaSize,
    check_context_fit,
    check_decoded_budget,
    default_request_budget,
)
from .caches import ItemCache, new_answer_cache
from .media import MediaLoader
from .metrics import RenderMetrics
from .prepare import (
    MediaRef,
    PreparedChat,
    ProcessorFacts,
    RequestLimits,
    prepare_chat,
    prepare_completion,
    prepare_messages,
    prepare_responses,
)
from .settings import RenderSettings
from .tasks import all_or_none, in_thread

__all__ = ["Renderer", "RenderService"]


class Renderer(Protocol):
    """What the service needs from the vLLM adapter (``vllm_renderer.EngineRenderer``)."""

    vocab_size: int
    max_model_len: int
    processor_facts: ProcessorFacts

    async def render_chat(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: Any,
        decoded: Any,
        *,
        embeds: Mapping[str, Any] | None = None,
    ) -> GenerateRequest[bytes | None]: ...

    async def render_completion(
        self, body: dict[str, Any], prompt_media: Sequence[Any] | None, encode: Any
    ) -> list[GenerateRequest[bytes | None]]: ...

    async def render_responses(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: Any,
        decoded: Any,
        *,
        embeds: Mapping[str, Any] | None = None,
    ) -> GenerateRequest[bytes | None]: ...

    async def render_messages(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: Any,
        decoded: Any,
        *,
        embeds: Mapping[str, Any] | None = None,
    ) -> GenerateRequest[bytes | None]: ...

    async def derender_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Upstream's derender answer (JSON-ready) for a whole answer or a streamed chunk."""
        ...

    async def derender_completion(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def tokenize(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        decoded: Any = None,
        *,
        embeds: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Upstream's ``/tokenize`` answer (JSON-ready)."""
        ...

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def load_media(self, modality: str, data: bytes, decoded: Any) -> Any:
        """Decode one item's vetted bytes as the chat route's parts of ``modality`` are."""
        ...

    def check_video_bytes(self, data: bytes) -> int:
        """Refuse an out-of-bounds video from its header; else its sampled frames' bytes."""
        ...

    def image_tokens(self, width: int, height: int, mm_kwargs: Mapping[str, Any]) -> int | None:
        """The model's placeholder tokens for an image of this size (None: no known rule)."""
        ...

    def new_decoded_cache(self, budget_bytes: int) -> Any: ...

    def accepted_wire_transforms(self, asked: frozenset[str], coded: bool) -> frozenset[str]:
        """Those of this model's wire transforms (``tandem_vllm.wire_transforms``) that a
        caller asking for ``asked`` (``*``: any) takes; ``coded``: it compresses its bodies."""
        ...

    def encode_item(self, item: Any, transforms: frozenset[str] = frozenset()) -> bytes: ...


class RenderService:
    """Turns chat/completion bodies into generate requests, one worker process's worth."""

    def __init__(
        self,
        settings: RenderSettings,
        renderer: Renderer,
        loader: MediaLoader,
        metrics: RenderMetrics,
    ) -> None:
        self.settings = settings
        self.renderer = renderer
        self.loader = loader
        self.metrics = metrics
        self.limits = RequestLimits.build(
            allowlist=frozenset(settings.mm_processor_kwargs_allowlist),
            facts=renderer.processor_facts,
            max_model_len=renderer.max_model_len,
            max_kwargs_pixels=settings.max_kwargs_pixels,
            max_kwargs_frames=settings.max_kwargs_frames,
            max_image_pixels=settings.max_image_pixels,
            enable_mm_embeds=settings.enable_mm_embeds,
            limit_mm_per_prompt=settings.limit_mm_per_prompt(),
        )
        self.request_budget = settings.max_decoded_request_bytes or default_request_budget(
            renderer.processor_facts.max_pixels,
            self.limits.most_items("image"),
            settings.max_image_pixels,
        )
        self.items = ItemCache(settings.item_cache_bytes, len)
        self.decoded = renderer.new_decoded_cache(settings.decoded_cache_bytes)
        # Whole answers by a hash of the exact request bytes, for a short while: an RL batch
        # sends the same prompt many times, and rendering is deterministic for equal bytes.
        self.answers = new_answer_cache(settings.answer_cache_bytes, settings.answer_cache_ttl_s)

    async def render_chat(
        self,
        raw: bytes,
        fmt: WireFormat,
        transforms: frozenset[str] = frozenset(),
        coded: bool = False,
        slot: Slot | None = None,
    ) -> GenerateRequest[bytes | None]:
        """``transforms``: the wire transforms the caller accepts (``*``: any), applied where
        this model has them and they are exact; ``coded``: the caller compresses its bodies
        (``*`` then takes the transforms that only pay under compression too)."""
        return await self._render_conversation(
            "chat", raw, fmt, transforms, coded, prepare_chat, self.renderer.render_chat, slot
        )

    async def render_responses(
        self,
        raw: bytes,
        fmt: WireFormat,
        transforms: frozenset[str] = frozenset(),
        coded: bool = False,
        slot: Slot | None = None,
    ) -> GenerateRequest[bytes | None]:
        """A Responses request, as ``render_chat`` (its input items' images screened)."""
        return await self._render_conversation(
            "responses",
            raw,
            fmt,
            transforms,
            coded,
            prepare_responses,
            self.renderer.render_responses,
            slot,
        )

    async def render_messages(
        self,
        raw: bytes,
        fmt: WireFormat,
        transforms: frozenset[str] = frozenset(),
        coded: bool = False,
        slot: Slot | None = None,
    ) -> GenerateRequest[bytes | None]:
        """An Anthropic Messages request, as ``render_chat`` (its image blocks screened)."""
        return await self._render_conversation(
            "messages",
            raw,
            fmt,
            transforms,
            coded,
            prepare_messages,
            self.renderer.render_messages,
            slot,
        )

    async def _render_conversation(
        self,
        route: str,
        raw: bytes,
        fmt: WireFormat,
        transforms: frozenset[str],
        coded: bool,
        prepare: Callable[[Any, RequestLimits], PreparedChat],
        render: Callable[..., Awaitable[GenerateRequest[bytes | None]]],
        slot: Slot | None = None,
    ) -> GenerateRequest[bytes | None]:
        names = self.renderer.accepted_wire_transforms(transforms, coded)
        with self._account(route):
            key = (route, names, blake3.blake3(raw).hexdigest())
            hit = self.answers.get(key)
            if hit is not None:
                self.metrics.answer_cache_hits.inc()
                return _fresh_id(hit[0], hit[1])
            body = decode_document(raw, Any, fmt)
            prepared = prepare(body, self.limits)
            media = await self._load_all(prepared.media, body, [prepared.media], slot)
            embeds = prepared.embed_tensors()
            self.metrics.media_bytes.inc(sum(int(t.nbytes) for t in embeds.values()))
            result = await render(
                prepared.body, media, self._encoder(names), self.decoded, embeds=embeds
            )
            self._remember(key, result, body, prepared.media)
            return result

    async def tokenize(
        self, raw: bytes, fmt: WireFormat, slot: Slot | None = None
    ) -> dict[str, Any]:
        """``/tokenize``: a prompt, or chat messages whose media are screened and fetched as
        the chat route's are."""
        with self._account("tokenize"):
            body = _object(decode_document(raw, Any, fmt))
            if "messages" not in body:
                return await self.renderer.tokenize(body, {})
            prepared = prepare_chat(body, self.limits)
            media = await self._load_all(prepared.media, body, [prepared.media], slot)
            return await self.renderer.tokenize(
                prepared.body, media, self.decoded, embeds=prepared.embed_tensors()
            )

    async def detokenize(self, raw: bytes, fmt: WireFormat) -> dict[str, Any]:
        with self._account("detokenize"):
            return await self.renderer.detokenize(_object(decode_document(raw, Any, fmt)))

    async def derender(self, route: str, raw: bytes, fmt: WireFormat) -> dict[str, Any]:
        """A generate answer, or one streamed chunk, as upstream's chat (``route`` "chat") or
        completion derender answers it."""
        with self._account(f"{route}_derender"):
            body = _object(decode_document(raw, Any, fmt))
            if route == "chat":
                return await self.renderer.derender_chat(body)
            return await self.renderer.derender_completion(body)

    def _remember(self, key: Any, result: Any, body: Any, media: Sequence[MediaRef]) -> None:
        # Only answers whose inputs are all in the body: a URL's content may change.
        if self.settings.answer_cache_ttl_s > 0 and all(
            r.url is None or r.url.startswith("data:") for r in media
        ):
            keeps_id = isinstance(body, dict) and "request_id" in body
            self.answers.put(key, (result, keeps_id))

    async def render_completion(
        self,
        raw: bytes,
        fmt: WireFormat,
        transforms: frozenset[str] = frozenset(),
        coded: bool = False,
        slot: Slot | None = None,
    ) -> list[GenerateRequest[bytes | None]]:
        names = self.renderer.accepted_wire_transforms(transforms, coded)
        with self._account("completion"):
            body = decode_document(raw, Any, fmt)
            prepared = prepare_completion(body, self.limits, self.renderer.vocab_size)
            prompt_media = None
            if prepared.media is not None:
                flat = [r for refs in prepared.media if refs for r in refs]
                prompts = [refs for refs in prepared.media if refs]
                loaded = await self._load_all(flat, body, prompts, slot)
                items = await all_or_none(
                    in_thread(self.renderer.load_media, r.modality, loaded[r.token], self.decoded)
                    for r in flat
                )
                by_token = dict(zip((r.token for r in flat), items, strict=True))
                # vLLM's multi_modal_data: a list per modality, in the order of that
                # modality's placeholders in the prompt.
                prompt_media = [
                    _by_modality(refs, by_token) if refs else None for refs in prepared.media
                ]
            return await self.renderer.render_completion(
                prepared.body, prompt_media, self._encoder(names)
            )

    def _encoder(self, transforms: frozenset[str]) -> Callable[[str, Any], bytes]:
        def encode(mm_hash: str, item: Any) -> bytes:
            key = (mm_hash, transforms)
            cached = self.items.get(key)
            if cached is not None:
                self.metrics.item_cache_hits.inc()
                return cached
            self.metrics.item_cache_misses.inc()
            data = self.renderer.encode_item(item, transforms)
            self.items.put(key, data)
            return data

        return encode

    async def _load_all(
        self,
        refs: Sequence[MediaRef],
        body: Any,
        prompts: Sequence[Sequence[MediaRef]],
        slot: Slot | None = None,
    ) -> dict[str, bytes]:
        """The bytes of ``refs`` by token, once every header says the request can be served:
        its media within the decoded budget, each prompt's (``prompts``) images within the
        context. Nothing is decoded before this returns. Under admission (``slot``), each
        fetched item is charged to the request as it arrives, and what they all decode to
        (from their headers) before any is decoded: refused 429 (413) when the process's
        byte budget has no room for them now (ever)."""
        charge = slot.take if slot is not None else None
        loaded = await all_or_none(self._load(r, charge) for r in refs)
        sizes = {r.token: size for r, (_, size) in zip(refs, loaded, strict=True)}
        check_decoded_budget(list(sizes.values()), self.request_budget)
        if slot is not None:
            slot.take(sum(s.decoded_bytes for s in sizes.values()))
        kwargs = body.get("mm_processor_kwargs") or {}
        for prompt in prompts:
            check_context_fit(
                [sizes[r.token] for r in prompt],
                self.renderer.image_tokens,
                kwargs,
                self.renderer.max_model_len,
            )
        return {r.token: data for r, (data, _) in zip(refs, loaded, strict=True)}

    async def _load(
        self, ref: MediaRef, charge: Callable[[int], None] | None = None
    ) -> tuple[bytes, MediaSize]:
        data = ref.data
        if data is None:
            data = await self.loader.load_bytes(ref.url or "", charge)
        # Header-only: a decompression bomb or an hour of video is refused before any pixel
        # is decoded.
        if ref.modality == "image":
            width, height = self.loader.check_image_bytes(data)
            size = MediaSize("image", width * height * RGB_BYTES, width, height)
        elif ref.modality == "video":
            size = MediaSize("video", self.renderer.check_video_bytes(data))
        elif ref.modality == "audio":
            header = self.loader.check_audio_bytes(data)
            # float32 samples, every channel, as vLLM's decoder returns them.
            size = MediaSize("audio", header.frames * header.channels * 4)
        else:
            raise RuntimeError(f"unknown modality {ref.modality!r}")  # prepare.py makes none
        self.metrics.media_bytes.inc(len(data))
        return data, size

    def _account(self, route: str) -> _Accounting:
        return _Accounting(self.metrics, route)


def _by_modality(refs: Sequence[MediaRef], items: Mapping[str, Any]) -> dict[str, list[Any]]:
    """A prompt's decoded items (``items`` by token) as a list per modality, in order."""
    out: dict[str, list[Any]] = {}
    for r in refs:
        out.setdefault(r.modality, []).append(items[r.token])
    return out


def _fresh_id(result: GenerateRequest[Any], keeps_id: bool) -> GenerateRequest[Any]:
    """The cached answer under a new request id (as a fresh render would have), unless the
    caller chose the id in its body."""
    if keeps_id:
        return result
    prefix = result.request_id.split("-", 1)[0]
    return msgspec.structs.replace(result, request_id=f"{prefix}-{secrets.token_hex(8)}")


class _Accounting:
    """Counts a request by route and outcome, and times it."""

    def __init__(self, metrics: RenderMetrics, route: str) -> None:
        self.metrics = metrics
        self.route = route
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        outcome = "ok" if exc_type is None else "error"
        self.metrics.requests.labels(self.route, outcome).inc()
        self.metrics.latency.labels(self.route).observe(time.perf_counter() - self.start)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body
