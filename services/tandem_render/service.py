"""The render service's logic, independent of HTTP: screen, fetch media, render, cache items."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tandem_wire import ByteBudgetLRU, GenerateRequest

from .errors import Overloaded
from .media import MediaLoader
from .metrics import RenderMetrics
from .prepare import MediaRef, RequestLimits, prepare_chat, prepare_completion
from .settings import RenderSettings

__all__ = ["Renderer", "RenderService"]


class Renderer(Protocol):
    """What the service needs from the vLLM adapter (``vllm_renderer.EngineRenderer``)."""

    vocab_size: int
    max_model_len: int

    async def render_chat(
        self, body: dict[str, Any], media: Mapping[str, bytes], encode: Any, decoded: Any
    ) -> GenerateRequest[bytes]: ...

    async def render_completion(
        self, body: dict[str, Any], prompt_media: Sequence[Any] | None, encode: Any
    ) -> list[GenerateRequest[bytes]]: ...

    def load_image(self, data: bytes, decoded: Any) -> Any: ...

    def new_decoded_cache(self, budget_bytes: int) -> Any: ...

    def encode_item(self, item: Any) -> bytes: ...


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
        self.limits = RequestLimits(
            max_images=settings.max_images_per_prompt,
            max_videos=settings.max_videos_per_prompt,
            mm_kwargs_allowlist=frozenset(settings.mm_processor_kwargs_allowlist),
            max_image_pixels=settings.max_image_pixels,
        )
        # mm_hash covers the media bytes and the processor kwargs, so equal hashes mean equal
        # items (callers cannot choose hashes: prepare refuses uuids).
        self.items = ByteBudgetLRU[str, bytes](settings.item_cache_bytes, len)
        self.decoded = renderer.new_decoded_cache(settings.decoded_cache_bytes)
        self._pending = 0

    async def render_chat(self, body: Any) -> GenerateRequest[bytes]:
        with self._admit("chat"):
            prepared = prepare_chat(body, self.limits)
            media = await self._load_all(prepared.media)
            return await self.renderer.render_chat(prepared.body, media, self._encode, self.decoded)

    async def render_completion(self, body: Any) -> list[GenerateRequest[bytes]]:
        with self._admit("completion"):
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
            return await self.renderer.render_completion(prepared.body, prompt_media, self._encode)

    def _encode(self, mm_hash: str, item: Any) -> bytes:
        cached = self.items.get(mm_hash)
        if cached is not None:
            self.metrics.item_cache_hits.inc()
            return cached
        self.metrics.item_cache_misses.inc()
        data = self.renderer.encode_item(item)
        self.items.put(mm_hash, data)
        return data

    async def _load_all(self, refs: Sequence[MediaRef]) -> dict[str, bytes]:
        datas = await asyncio.gather(*(self._load(r) for r in refs))
        return {r.token: d for r, d in zip(refs, datas, strict=True)}

    async def _load(self, ref: MediaRef) -> bytes:
        data = ref.data if ref.data is not None else await self.loader.load_bytes(ref.url or "")
        if ref.modality == "image":
            # Header-only: a decompression bomb is refused before any pixel is decoded.
            self.loader.check_image_bytes(data)
        self.metrics.media_bytes.inc(len(data))
        return data

    def _admit(self, route: str) -> _Admission:
        return _Admission(self, route)


class _Admission:
    """Bounds the requests a worker holds; past the bound, answer 429 instead of queueing."""

    def __init__(self, service: RenderService, route: str) -> None:
        self.service = service
        self.route = route
        self.start = 0.0

    def __enter__(self) -> None:
        s = self.service
        if s._pending >= s.settings.max_pending:
            s.metrics.rejected.labels(self.route).inc()
            raise Overloaded(f"more than {s.settings.max_pending} requests pending; retry")
        s._pending += 1
        s.metrics.pending.inc()
        self.start = time.perf_counter()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = self.service
        s._pending -= 1
        s.metrics.pending.dec()
        outcome = "ok" if exc_type is None else "error"
        s.metrics.requests.labels(self.route, outcome).inc()
        s.metrics.latency.labels(self.route).observe(time.perf_counter() - self.start)
