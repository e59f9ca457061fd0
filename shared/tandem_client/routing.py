"""Which node serves a request: round robin for render, hash-affinity for generate."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping, Sequence

__all__ = ["ROUTE_KEY_HEADER", "RoundRobin", "affinity_key", "rendezvous", "rendezvous_order"]

ROUTE_KEY_HEADER = "x-tandem-route-key"
"""Sent with each generate request: the ``affinity_key`` of the request as rendered. A proxy
in front of several generate nodes (the front door) routes by it, so a repeat whose items go as
null entries (named by content id) reaches the node the data went to."""


def affinity_key(mm_hashes: Mapping[str, Sequence[str]] | None, request_id: str | None) -> str:
    """What generate requests are routed by: the first item hash (modalities in name order),
    so repeats of an image meet the node holding it; else the request id ("" if none)."""
    for modality in sorted(mm_hashes or {}):
        hashes = (mm_hashes or {})[modality]
        if hashes:
            return str(hashes[0])
    return request_id or ""


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
