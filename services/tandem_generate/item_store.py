"""Decoded items by (tenant, caller's mm_hash), so a request may send a kwargs entry as null."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from tandem_wire import KwargsItem

from .metrics import GenerateMetrics

__all__ = ["ItemStore", "StoredItem"]

CONTESTED_BYTES = 16 * 1024 * 1024
"""Budget of the contested keys (about 50,000 of them with 64-hex hashes)."""

_KEY_OVERHEAD = 256  # bytes of Python objects per remembered key, beyond its characters

Key = tuple[str, str]


@dataclass(frozen=True)
class StoredItem:
    content_id: str
    """Hex blake3 of tenant and item bytes: the ``mm_hash`` the engine sees."""
    item: Any
    """The vLLM ``MultiModalKwargsItem``."""
    wire: KwargsItem
    nbytes: int


class ItemStore:
    """Decoded items bounded in bytes, least recently used dropped first.

    A hash seen with two different contents is *contested*: it is never served from the store
    again, so a null entry always means the bytes that hash was first and only ever sent with. A
    caller reusing someone's hash costs them a resend, nothing more. Contested keys live apart
    from the items, in their own byte budget, so evicting items does not forget them.

    Only lookups (null entries) count as hits or misses; storing an item is neither.
    """

    def __init__(
        self, budget_bytes: int, metrics: GenerateMetrics, contested_bytes: int = CONTESTED_BYTES
    ) -> None:
        self._items = LRUCache[Key, StoredItem](budget_bytes, getsizeof=_item_size)
        # Values are what each key costs, so the budget holds however long callers' keys are.
        self._contested = LRUCache[Key, int](contested_bytes, getsizeof=int)
        self._metrics = metrics
        # Builds run on the event loop today; the lock keeps the store whole if one moves to
        # a thread.
        self._lock = threading.Lock()

    def get(self, tenant: str, mm_hash: str) -> StoredItem | None:
        """The item a null entry stands for, or None (not held, or contested): resend."""
        key = (tenant, mm_hash)
        with self._lock:
            stored = None if key in self._contested else self._items.get(key)
        m = self._metrics
        (m.item_cache_misses if stored is None else m.item_cache_hits).inc()
        return stored

    def put(self, tenant: str, mm_hash: str, stored: StoredItem) -> None:
        """Remember an item sent with data; other contents under a held hash contest it."""
        key = (tenant, mm_hash)
        with self._lock:
            if key in self._contested:
                return
            existing = self._items.get(key)
            if existing is None:
                _store(self._items, key, stored)
            elif existing.content_id != stored.content_id:
                del self._items[key]
                _store(self._contested, key, len(tenant) + len(mm_hash) + _KEY_OVERHEAD)

    def clear(self) -> None:
        """Forget every item and contested key, as a restart would."""
        with self._lock:
            self._items.clear()
            self._contested.clear()


def _item_size(stored: StoredItem) -> int:
    return stored.nbytes


def _store(cache: LRUCache[Key, Any], key: Key, value: Any) -> None:
    try:
        cache[key] = value
    except ValueError:  # cachetools' "value too large": larger than the whole budget, not kept
        pass
