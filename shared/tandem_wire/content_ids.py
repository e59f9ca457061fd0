"""Content ids: how a null kwargs entry names the item bytes its sender sent before."""

from __future__ import annotations

import blake3

__all__ = ["content_id"]


def content_id(tenant: str, data: bytes | bytearray | memoryview) -> str:
    """The 64-hex blake3 of the tenant (``cache_salt`` or ""), a zero byte and an encoded
    item's bytes. A generate node keys the items it holds by it, so a null entry (whose
    ``mm_hash`` is this id) resolves only to the very bytes its sender sent: never to other
    pixels registered under a reused hash."""
    h = blake3.blake3(tenant.encode("utf-8"))
    h.update(b"\x00")
    h.update(data)
    return h.hexdigest()
