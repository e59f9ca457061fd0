"""Content ids: the one identity an item has from render's answer to the engine's caches.

Render names every item whose bytes it sends by ``content_id(cache_salt or "", bytes)``
(``named_by_content``), and a generate node keys the items it holds, its encoder cache and
its prefix cache by the content id of the bytes it received, whatever name they came with.
The name a scheduler reads in render's answer is thus the key in the node's KV-cache events,
and a reused name with other bytes is just another identity: nobody is served pixels they did
not send, nor poisons another request's caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import blake3
import msgspec

from .protocol import MultiModalFeatures

__all__ = ["content_id", "named_by_content"]

ItemT = TypeVar("ItemT", bound=bytes | bytearray | memoryview | None)


def content_id(tenant: str, data: bytes | bytearray | memoryview) -> str:
    """The 64-hex blake3 of the tenant (``cache_salt`` or ""), a zero byte and an encoded
    item's bytes. A generate node keys the items it holds by it, so a null entry (whose
    ``mm_hash`` is this id) resolves only to the very bytes its sender sent: never to other
    pixels registered under a reused hash."""
    h = blake3.blake3(tenant.encode("utf-8"))
    h.update(b"\x00")
    h.update(data)
    return h.hexdigest()


def named_by_content(features: MultiModalFeatures[ItemT], tenant: str) -> MultiModalFeatures[ItemT]:
    """``features`` with each item whose bytes it carries named by their content id. Items
    without bytes (hashes only, or null entries) keep their names: there is nothing to name
    them by, and a null entry's name already is the content id of bytes sent before."""
    data = features.kwargs_data
    if not data:
        return features
    hashes = {}
    for modality, names in features.mm_hashes.items():
        items: Sequence[ItemT | None] = data.get(modality) or [None] * len(names)
        hashes[modality] = [
            name if item is None else content_id(tenant, item)
            for name, item in zip(names, items, strict=True)
        ]
    return msgspec.structs.replace(features, mm_hashes=hashes)
