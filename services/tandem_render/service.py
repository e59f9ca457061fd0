"""The render service's logic, independent of HTTP: screen, fetch media, render, cache items."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import blake3
import msgspec

from tandem_wire import GenerateRequest, WireFormat, decode_document

from .caches import ItemCache, new_answer_cache
from .media import MediaLoader
from .metrics import RenderMetrics
from .prepare import MediaRef, ProcessorFacts, RequestLimits, prepare_chat, prepare_completion
from .settings import RenderSettings

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

    def load_image(self, data: bytes, decoded: Any) -> Any: ...

    def check_video_bytes(self, data: bytes) -> None: ...

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
            max_images=settings.max_images_per_prompt,
            max_videos=settings.max_videos_per_prompt,
            max_audios=settings.max_audios_per_prompt,
            allowlist=frozenset(settings.mm_processor_kwargs_allowlist),
            facts=renderer.processor_facts,
            max_model_len=renderer.max_model_len,
            max_kwargs_pixels=settings.max_kwargs_pixels,
            max_kwargs_frames=settings.max_kwargs_frames,
            max_image_pixels=settings.max_image_pixels,
            enable_mm_embeds=settings.enable_mm_embeds,
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
    ) -> GenerateRequest[bytes | None]:
        """``transforms``: the wire transforms the caller accepts (``*``: any), applied where
        this model has them and they are exact; ``coded``: the caller compresses its bodies
        (``*`` then takes the transforms that only pay under compression too)."""
        names = self.renderer.accepted_wire_transforms(transforms, coded)
        with self._account("chat"):
            key = ("chat", names, blake3.blake3(raw).hexdigest())
            hit = self.answers.get(key)
            if hit is not None:
                self.metrics.answer_cache_hits.inc()
                return _fresh_id(hit[0], hit[1])
            body = decode_document(raw, Any, fmt)
            prepared = prepare_chat(body, self.limits)
            media = await self._load_all(prepared.media)
            embeds = prepared.embed_tensors()
            self.metrics.media_bytes.inc(sum(int(t.nbytes) for t in embeds.values()))
            result = await self.renderer.render_chat(
                prepared.body, media, self._encoder(names), self.decoded, embeds=embeds
            )
            self._remember(key, result, body, prepared.media)
            return result

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
    ) -> list[GenerateRequest[bytes | None]]:
        names = self.renderer.accepted_wire_transforms(transforms, coded)
        with self._account("completion"):
            body = decode_document(raw, Any, fmt)
            prepared = prepare_completion(body, self.limits, self.renderer.vocab_size)
            prompt_media = None
            if prepared.images is not None:
                flat = [r for refs in prepared.images if refs for r in refs]
                loaded = await self._load_all(flat)
                images = await asyncio.gather(
                    *(
                        asyncio.to_thread(self.renderer.load_image, loaded[r.token], self.decoded)
                        for r in flat
                    )
                )
                by_token = dict(zip((r.token for r in flat), images, strict=True))
                prompt_media = [
                    {"image": [by_token[r.token] for r in refs]} if refs else None
                    for refs in prepared.images
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

    async def _load_all(self, refs: Sequence[MediaRef]) -> dict[str, bytes]:
        datas = await asyncio.gather(*(self._load(r) for r in refs))
        return {r.token: d for r, d in zip(refs, datas, strict=True)}

    async def _load(self, ref: MediaRef) -> bytes:
        data = ref.data if ref.data is not None else await self.loader.load_bytes(ref.url or "")
        # Header-only: a decompression bomb or an hour of video is refused before any pixel
        # is decoded.
        if ref.modality == "image":
            self.loader.check_image_bytes(data)
        elif ref.modality == "video":
            self.renderer.check_video_bytes(data)
        elif ref.modality == "audio":
            self.loader.check_audio_bytes(data)
        self.metrics.media_bytes.inc(len(data))
        return data

    def _account(self, route: str) -> _Accounting:
        return _Accounting(self.metrics, route)


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
