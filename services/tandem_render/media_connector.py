"""A vLLM media connector that serves only media this service fetched and vetted itself."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaConnector
from vllm.multimodal.media.connector import global_thread_pool

from .errors import InvalidImage, MediaSchemeNotAllowed
from .prepare import MEDIA_URL_PREFIX

__all__ = ["CONNECTOR_NAME", "register_connector", "prefetched_media"]

CONNECTOR_NAME = "tandem-prefetched"

_M = TypeVar("_M")
_MEDIA: contextvars.ContextVar[Mapping[str, bytes]] = contextvars.ContextVar("tandem_media")


@contextmanager
def prefetched_media(media: Mapping[str, bytes]) -> Iterator[None]:
    """Make ``media`` (token URL -> bytes) what the connector serves within this context."""
    token = _MEDIA.set(media)
    try:
        yield
    finally:
        _MEDIA.reset(token)


def _lookup(url: str) -> bytes:
    # Defence in depth: the walker rewrote every media URL, so anything else reaching vLLM
    # (a URL smuggled through a field we do not walk) is refused, never fetched.
    data = _MEDIA.get({}).get(url) if url.startswith(MEDIA_URL_PREFIX) else None
    if data is None:
        raise MediaSchemeNotAllowed("media must come from a supported content part")
    return data


def _decode(media_io: Any, data: bytes) -> Any:
    try:
        return media_io.load_bytes(data)
    except (ValueError, OSError) as exc:
        raise InvalidImage(f"could not decode media: {str(exc)[:120]}") from None


class PrefetchedMediaConnector(MediaConnector):
    """Decodes prefetched bytes with vLLM's own media IO, so items and hashes match upstream."""

    def load_from_url(self, url: str, media_io: Any, *, fetch_timeout: int | None = None) -> Any:
        return _decode(media_io, _lookup(url))

    async def load_from_url_async(
        self, url: str, media_io: Any, *, fetch_timeout: int | None = None
    ) -> Any:
        data = _lookup(url)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(global_thread_pool, _decode, media_io, data)


def register_connector() -> str:
    """Register the connector with vLLM (idempotent) and return its name for
    ``VLLM_MEDIA_CONNECTOR``."""
    MEDIA_CONNECTOR_REGISTRY.register(CONNECTOR_NAME)(PrefetchedMediaConnector)
    return CONNECTOR_NAME
