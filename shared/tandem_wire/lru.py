"""A least-recently-used map bounded by the total bytes of its values (item caches)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ByteBudgetLRU"]

K = TypeVar("K")
V = TypeVar("V")


class ByteBudgetLRU(Generic[K, V]):
    """Keeps the most recently used values whose sizes add up to at most ``budget`` bytes.

    A value larger than the whole budget is never stored. Thread-safe.
    """

    def __init__(self, budget: int, size_of: Callable[[V], int]) -> None:
        self.budget = budget
        self._size_of = size_of
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: K, value: V) -> None:
        size = self._size_of(value)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.budget:
                return
            self._data[key] = (value, size)
            self._bytes += size
            while self._bytes > self.budget:
                _, (_, evicted) = self._data.popitem(last=False)
                self._bytes -= evicted

    def get_or_create(self, key: K, create: Callable[[], V]) -> V:
        """The cached value, or ``create()`` stored and returned."""
        value = self.get(key)
        if value is None:
            value = create()
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0
