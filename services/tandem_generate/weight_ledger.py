"""What weights a node holds, by what it loaded rather than by its label.

A router in front of several nodes lets a node serve only when it holds the fleet's weights
(``tandem_client.fleet``); labels cannot tell it (TRL finishes an update with ``{}``, which
keeps the old one). So each node keeps, for every checkpoint tensor name, the id of the update
that last wrote it (``tandem_wire.control.UpdateId``, minted by whoever ran the update and the
same on every node). Two nodes started from the same checkpoint whose maps are equal hold equal
weights, however they got there: a node that missed an update is level again once every tensor
that update wrote has been written since. ``weights_id`` is a digest of the map.

An update whose tensor names cannot be known (a backend whose chunks do not name them) is
chained into the digest instead, so it separates nodes that missed it until an update writes
every tensor. A node whose weights or caches are not what the digest says (a chunk applied in
place and then abandoned, a failed finish, a prefix cache that would not reset) is ``unclean``
and serves nothing behind a router until it is whole again.

Imports neither vLLM nor torch: the engine adapter (``control``) tells it what happened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from tandem_wire.control import APPLIED_REPORTED, UpdateId, WeightInfo, WeightTransferState

__all__ = [
    "FINISH_FAILED",
    "PARTIAL_LOAD",
    "PREFIX_CACHE_NOT_RESET",
    "WeightLedger",
]

PARTIAL_LOAD = "partial_load"
FINISH_FAILED = "finish_failed"
PREFIX_CACHE_NOT_RESET = "prefix_cache_not_reset"


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode())
        h.update(b"\n")
    return h.hexdigest()


class WeightLedger:
    """One node's record of its weights (see the module doc); not thread-safe, the caller
    serialises weight calls (``EngineControl`` holds a lock)."""

    def __init__(self, checkpoint: str, names: Callable[[], frozenset[str] | None]) -> None:
        self._base = _digest("checkpoint", checkpoint)
        self._names = names
        """The checkpoint's tensor names (None: cannot be read), asked only when needed."""
        self._writers: dict[str, str] = {}
        self._chain = ""
        self._applied: list[int] = []
        self.seen_seq = 0
        self.unclean: str | None = None
        self._unwritten: set[str] | None = None
        self.current: UpdateId | None = None
        self._written: set[str] | None = set()
        """Names the update under way wrote so far (None: some chunk did not name its own)."""
        self.chunks = 0
        self._id = self._compute_id()

    # -- what happened -----------------------------------------------------------------------

    def start(self, update_id: UpdateId | None) -> UpdateId:
        """An update begins (``update_id`` None: the caller sent none, one is minted here)."""
        uid = update_id or UpdateId.mint(self.seen_seq)
        self.seen_seq = max(self.seen_seq, uid.seq)
        self.current, self._written, self.chunks = uid, set(), 0
        return uid

    def chunk(self, names: Iterable[str] | None) -> None:
        """A chunk was taken (``names``: the tensors it writes; None: not known)."""
        self.chunks += 1
        if names is None or self._written is None:
            self._written = None
        else:
            self._written.update(names)

    def finished(self) -> None:
        """The update under way is loaded: its tensors now carry its id."""
        if self.current is None:
            return
        uid, written = str(self.current), self._written
        if written is None:
            self._chain = _digest(self._chain, uid)
        else:
            self._writers.update(dict.fromkeys(written, uid))
            if self._covers_all(written):
                self._chain = ""  # every tensor is this update's: nothing before it counts
        self._applied.insert(0, self.current.seq)
        del self._applied[APPLIED_REPORTED:]
        self._wrote(written)
        self.current = None
        self._id = self._compute_id()

    def ended(self, loaded_in_place: bool) -> None:
        """The update under way ended without a finish: nothing of it is loaded, unless a
        backend applied chunks in place (then the weights are partly new: unclean)."""
        if loaded_in_place and self.chunks:
            self.mark_unclean(PARTIAL_LOAD)
        self.current = None

    def mark_unclean(self, reason: str) -> None:
        """The weights or caches may not be what ``weights_id`` says."""
        if reason in (PARTIAL_LOAD, FINISH_FAILED):
            names = self._names()
            self._unwritten = None if names is None else set(names)
            reason = PARTIAL_LOAD
        self.unclean = reason
        self._id = self._compute_id()

    def cache_reset(self) -> None:
        """The prefix cache was reset: a finish whose reset failed is whole again."""
        if self.unclean == PREFIX_CACHE_NOT_RESET:
            self.unclean = None

    # -- what it tells ---------------------------------------------------------------------

    @property
    def weights_id(self) -> str:
        return self._id

    def info(self, weight_version: str, transfer: WeightTransferState) -> WeightInfo:
        return WeightInfo(
            weight_version=weight_version,
            updating=self.current is not None,
            weights_id=self._id,
            update_seq=self._applied[0] if self._applied else 0,
            applied_seqs=list(self._applied),
            seen_seq=self.seen_seq,
            unclean=self.unclean,
            unwritten=len(self._unwritten) if self._unwritten is not None else None,
            weight_transfer=transfer,
        )

    # -- internals -------------------------------------------------------------------------

    def _covers_all(self, written: set[str]) -> bool:
        names = self._names()
        return names is not None and bool(names) and names <= written

    def _wrote(self, written: set[str] | None) -> None:
        """A partial load is made whole once every tensor has been written since."""
        if self.unclean != PARTIAL_LOAD or written is None or self._unwritten is None:
            return
        self._unwritten -= written
        if not self._unwritten:
            self.unclean, self._unwritten = None, None
            self._chain = ""

    def _compute_id(self) -> str:
        pairs = (f"{name}={uid}" for name, uid in sorted(self._writers.items()))
        return _digest(self._base, self._chain, *pairs)
