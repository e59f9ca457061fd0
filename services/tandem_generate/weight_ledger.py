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
place and then abandoned, a failed finish or finalize, a prefix cache that would not reset) is
``unclean`` and serves nothing behind a router until it is whole again. ``unclean`` is derived
from what is left to mend, never kept beside it: tensors still unwritten since a partial load
(``partial_load``, mended only by writing them), then a prefix cache not reset since new
weights were loaded (``prefix_cache_not_reset``, mended by a reset); a reset never mends a
partial load.

Each update under way keeps a receipt of the chunks it took (``UpdateReceipt``), so that a
finish can be refused when the caller sent other chunks than arrived.

Imports neither vLLM nor torch: the engine adapter (``control``) tells it what happened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from tandem_wire.control import (
    APPLIED_REPORTED,
    UpdateId,
    UpdateReceipt,
    WeightInfo,
    WeightTransferState,
)

__all__ = [
    "PARTIAL_LOAD",
    "PREFIX_CACHE_NOT_RESET",
    "WeightLedger",
]

PARTIAL_LOAD = "partial_load"
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
        self._unwritten: set[str] | None = None
        """Since a partial load: the tensors not written again yet (None: no partial load)."""
        self._unwritten_known = True
        """False when the checkpoint's names could not be read: a partial load stays."""
        self._cache_stale = False
        """New weights were loaded and the prefix cache could not be reset since."""
        self.current: UpdateId | None = None
        self.receipt: UpdateReceipt | None = None
        """What the update under way took so far (None: none is under way)."""
        self._written: set[str] | None = set()
        """Names the update under way wrote so far (None: some chunk did not name its own)."""
        self._id = self._compute_id()

    # -- what happened -----------------------------------------------------------------------

    def start(self, update_id: UpdateId | None) -> UpdateId:
        """An update begins (``update_id`` None: the caller sent none, one is minted here)."""
        uid = update_id or UpdateId.mint(self.seen_seq)
        self.seen_seq = max(self.seen_seq, uid.seq)
        self.current, self._written = uid, set()
        self.receipt = UpdateReceipt.begin(uid)
        return uid

    def already_seen(self, update_id: UpdateId | None) -> bool:
        """Whether a router's ``update_id`` has a SEQ this node has seen start: two routers
        minted it (one counted from a stale view of the fleet), and taking it would put two
        updates in one place of the fleet's order. The router mints again above."""
        return update_id is not None and update_id.seq <= self.seen_seq

    def outdated_by(self, update_id: UpdateId | None) -> bool:
        """Whether a start with ``update_id`` may end the update under way: a router's id newer
        than its own means its trainer moved on (it crashed mid-update, or its abort was lost).
        A start without an id, or with one not newer, is refused as vLLM refuses it."""
        current = self.current
        return current is not None and update_id is not None and update_id.seq > current.seq

    @property
    def chunks(self) -> int:
        return self.receipt.chunks if self.receipt is not None else 0

    def chunk(self, names: Iterable[str] | None, update_info: Any) -> None:
        """A chunk was taken (``names``: the tensors it writes, None: not known;
        ``update_info``: as the caller sent it, for the receipt)."""
        if self.receipt is not None:
            self.receipt = self.receipt.took(update_info)
        if names is None or self._written is None:
            self._written = None
        else:
            self._written.update(names)

    def receipt_differs(self, told: str) -> str | None:
        """Why a finish expecting the receipt ``told`` (``UpdateReceipt.header``) must be
        refused here (None: this node took exactly those chunks)."""
        mine = self.receipt
        if mine is None or mine.header() == told:
            return None
        return (
            f"this node took {mine.chunks} chunk(s) of update {mine.update_id} (receipt "
            f"{mine.header()}), the caller finishes after other chunks (receipt {told}): one "
            "was lost on the way, so nothing of the update is loaded here"
        )

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
        self._end()
        self._id = self._compute_id()

    def ended(self, loaded_in_place: bool) -> None:
        """The update under way ended without a finish: nothing of it is loaded, unless a
        backend applied chunks in place (then the weights are partly new: unclean)."""
        if loaded_in_place and self.chunks:
            self.partial_load()
        self._end()

    def finish_failed(self) -> None:
        """The update under way failed while loading (or a finalize failed): what the model
        holds is not known."""
        self._end()
        self.partial_load()

    def partial_load(self) -> None:
        """The weights may be partly new: every tensor must be written again."""
        names = self._names()
        self._unwritten = set(names) if names is not None else set()
        self._unwritten_known = names is not None
        self._id = self._compute_id()

    def cache_not_reset(self) -> None:
        """The prefix cache could not be reset after new weights were loaded."""
        self._cache_stale = True

    def cache_reset(self) -> None:
        """The prefix cache was reset: no KV of older weights is left."""
        self._cache_stale = False

    # -- what it tells ---------------------------------------------------------------------

    @property
    def unclean(self) -> str | None:
        """Why the weights or caches may not be what ``weights_id`` says (None: they are)."""
        if self._unwritten is not None:
            return PARTIAL_LOAD
        if self._cache_stale:
            return PREFIX_CACHE_NOT_RESET
        return None

    @property
    def weights_id(self) -> str:
        return self._id

    def info(self, weight_version: str, transfer: WeightTransferState) -> WeightInfo:
        partial = self._unwritten is not None and self._unwritten_known
        return WeightInfo(
            weight_version=weight_version,
            updating=self.current is not None,
            weights_id=self._id,
            update_seq=self._applied[0] if self._applied else 0,
            applied_seqs=list(self._applied),
            seen_seq=self.seen_seq,
            unclean=self.unclean,
            unwritten=len(self._unwritten) if partial and self._unwritten is not None else None,
            weight_transfer=transfer,
            receiving=self.receipt,
        )

    # -- internals -------------------------------------------------------------------------

    def _end(self) -> None:
        self.current, self.receipt = None, None

    def _covers_all(self, written: set[str]) -> bool:
        names = self._names()
        return names is not None and bool(names) and names <= written

    def _wrote(self, written: set[str] | None) -> None:
        """A partial load is made whole once every tensor has been written since."""
        if self._unwritten is None or written is None or not self._unwritten_known:
            return
        self._unwritten -= written
        if not self._unwritten:
            self._unwritten = None
            self._chain = ""

    def _compute_id(self) -> str:
        pairs = (f"{name}={uid}" for name, uid in sorted(self._writers.items()))
        return _digest(self._base, self._chain, *pairs)
