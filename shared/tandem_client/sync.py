"""The synchronous face: the async client on an event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from tandem_wire import GenerateRequest, GenerateResponse

from .client import AsyncTandemClient
from .discovery import NodeSource
from .rollout import RolloutResult

__all__ = ["TandemClient"]

T = TypeVar("T")


class TandemClient:
    """Blocking calls with the same arguments as AsyncTandemClient's (see there)."""

    def __init__(
        self,
        render_urls: str | Sequence[str],
        generate_urls: str | Sequence[str] | NodeSource,
        **kwargs: Any,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tandem-client", daemon=True
        )
        self._thread.start()

        async def make() -> AsyncTandemClient:
            return AsyncTandemClient(render_urls, generate_urls, **kwargs)

        self.aio = self._run(make())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> TandemClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self.aio.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def render_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> GenerateRequest[Any]:
        return self._run(self.aio.render_chat(messages, **kwargs))

    def render_completion(self, prompt: Any, **kwargs: Any) -> list[GenerateRequest[Any]]:
        return self._run(self.aio.render_completion(prompt, **kwargs))

    def generate(self, request: GenerateRequest[Any], **sampling: Any) -> GenerateResponse:
        return self._run(self.aio.generate(request, **sampling))

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> GenerateResponse:
        return self._run(self.aio.chat(messages, **kwargs))

    def rollout(self, prompts: Any, images: Any = None, **kwargs: Any) -> RolloutResult:
        return self._run(self.aio.rollout(prompts, images, **kwargs))

    def pause(self, mode: str = "keep", *, clear_cache: bool = True) -> None:
        self._run(self.aio.pause(mode, clear_cache=clear_cache))

    def resume(self) -> None:
        self._run(self.aio.resume())

    def weight_versions(self) -> dict[str, str]:
        return self._run(self.aio.weight_versions())

    def update_weights(self, weights: Any, *, version: str | None = None) -> None:
        self._run(self.aio.update_weights(weights, version=version))
