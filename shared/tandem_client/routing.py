"""Which node serves a request: round robin for render, hash-affinity for generate."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

__all__ = ["RoundRobin", "rendezvous", "rendezvous_order"]


class RoundRobin:
    """Spreads stateless render requests over the render URLs."""

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("at least one URL is needed")
        self.urls = list(urls)
        self._next = itertools.cycle(range(len(self.urls)))

    def pick(self) -> str:
        return self.urls[next(self._next)]


def _score(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{url}|{key}".encode(), digest_size=8).digest()


def rendezvous(key: str, urls: Sequence[str]) -> str:
    """The URL with the highest hash for ``key``: stable, and adding or removing a node only
    moves the keys that node wins or held (so repeats of an image keep hitting its cache)."""
    return max(urls, key=lambda u: _score(key, u))


def rendezvous_order(key: str, urls: Sequence[str]) -> list[str]:
    """Every URL, best first for ``key``: where its requests go when the nodes before fail
    (each failed node's keys spread over the others; no other key moves)."""
    return sorted(urls, key=lambda u: _score(key, u), reverse=True)
