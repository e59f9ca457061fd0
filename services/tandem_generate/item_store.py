"""Decoded items by (tenant, content id), so a request may send a kwargs entry as null."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from tandem_wire import KwargsItem

from .metrics import GenerateMetrics

__all__ = ["ItemStore", "StoredItem"]

Key = tuple[str, str]


@dataclass(frozen=True)
class StoredItem:
    content_id: str
    """``tandem_wire.content_id`` of tenant and item bytes: the store's key, and the
    ``mm_hash`` the engine sees."""
    item: Any
    """The vLLM ``MultiModalKwargsItem``."""
    wire: KwargsItem
    nbytes: int


class ItemStore:
    """Decoded items bounded in bytes, least recently used dropped first.

    Keyed by content: a null entry names the content id of the bytes its sender sent, so it
    can only ever resolve to those bytes (whatever else was registered, evicted or sent under
    a reused ``mm_hash`` meanwhile). Only lookups (null entries) count as hits or misses.
    """

    def __init__(self, budget_bytes: int, metrics: GenerateMetrics) -> None:
        self._items = LRUCache[Key, StoredItem](budget_bytes, getsizeof=_item_size)
        self._metrics = metrics
        # Builds run on the event loop today; the lock keeps the store whole if one moves to
        # a thread.
        self._lock = threading.Lock()

    def get(self, tenant: str, content_id: str) -> StoredItem | None:
        """The item a null entry names, or None (not held): the caller resends it."""
        with self._lock:
            stored = self._items.get((tenant, content_id))
        m = self._metrics
        (m.item_cache_misses if stored is None else m.item_cache_hits).inc()
        return stored

    def put(self, tenant: str, stored: StoredItem) -> None:
        """Remember an item sent with its data."""
        with self._lock:
            try:
                self._items[(tenant, stored.content_id)] = stored
            except ValueError:  # cachetools' "value too large": larger than the whole budget
                pass

    def clear(self) -> None:
        """Forget every item, as a restart would."""
        with self._lock:
            self._items.clear()


def _item_size(stored: StoredItem) -> int:
    return stored.nbytes
