"""The render service's caches: cachetools maps bounded by the bytes of their values."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from cachetools import Cache, LRUCache, TTLCache

from tandem_wire import GenerateRequest

__all__ = ["AnswerCache", "ByteBudgetCache", "DecodedCache", "ItemCache", "new_answer_cache"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteBudgetCache(Generic[K, V]):
    """The most recently used values whose sizes add up to at most ``budget`` bytes, each kept
    at most ``ttl_s`` seconds if given.

    A value larger than the whole budget is not stored (and the key's old value is dropped).
    Locked: vLLM's media threads and the event loop share these caches, and cachetools' are not
    thread-safe.
    """

    def __init__(
        self,
        budget: int,
        size_of: Callable[[V], int],
        ttl_s: float | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache: Cache[K, V] = (
            LRUCache(budget, getsizeof=size_of)
            if ttl_s is None
            else TTLCache(budget, ttl_s, timer=timer, getsizeof=size_of)
        )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._cache

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return int(self._cache.currsize)

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._cache.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            try:
                self._cache[key] = value
            except ValueError:  # cachetools' "value too large": the value is not kept
                self._cache.pop(key, None)


ItemCache = ByteBudgetCache[tuple[str, frozenset[str]], bytes]
"""Encoded items by (mm_hash, wire transforms applied where exact). mm_hash covers the media
bytes and the processor kwargs, so equal hashes mean equal items (callers cannot choose hashes:
prepare refuses uuids)."""

DecodedCache = ByteBudgetCache[tuple[str, str], Any]
"""Decoded media by (media IO settings, blake3 of the bytes), so a repeated image (an RL batch
sends each prompt many times) is not decoded again."""

AnswerCache = ByteBudgetCache[tuple[str, frozenset[str], str], tuple[GenerateRequest[Any], bool]]
"""Rendered answers (and whether the caller chose the request id) by (route, wire transforms
accepted, blake3 of the request body)."""


def new_answer_cache(
    budget: int, ttl_s: float, timer: Callable[[], float] = time.monotonic
) -> AnswerCache:
    """Answers expire after ``ttl_s`` (chat templates may read the clock); 0 keeps none."""
    return AnswerCache(budget if ttl_s > 0 else 0, _answer_size, ttl_s=ttl_s, timer=timer)


def _answer_size(entry: tuple[GenerateRequest[Any], bool]) -> int:
    feats = entry[0].features
    items = feats.kwargs_data if feats is not None and feats.kwargs_data else {}
    return 8 * len(entry[0].token_ids) + sum(len(d or b"") for v in items.values() for d in v)
