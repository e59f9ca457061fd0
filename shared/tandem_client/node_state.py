"""One generate node as one router sees it: what it last told, whether it answers, and what
its history says, each changed only by the transitions written here (``Node``'s methods), and
the states a router reads off them as one type (``NodeState``; judged by
``tandem_client.fleet.judge``, which knows the other nodes too).

A node's state has three sides:
- **reach**: reachable, cooling (it refused or dropped a call lately: it comes last), or gone
  (unreachable past the node timeout: it has left the fleet);
- **serving**: serving, paused (it missed a ``/resume``), restarted (a new process on its
  checkpoint) or fenced (anything else that keeps requests off it: other weights, unclean, a
  failed update step...);
- **update**: the update under way it takes part in, or none.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from tandem_wire.control import APPLIED_REPORTED, UpdateId, UpdateReceipt

__all__ = ["NEVER_TOLD", "Node", "NodeAnswer", "NodeState", "Reach", "Serving", "Told"]


@dataclass(frozen=True)
class NodeAnswer:
    """What one node said (``status`` 0: it was not reached, ``body`` says how: a text, or an
    error whose ``type`` says why when it is not the node's fault, as a full pool at the
    caller)."""

    url: str
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def type(self) -> str:
        info = self.body.get("error") if isinstance(self.body, dict) else None
        kind = info.get("type") if isinstance(info, dict) else None
        return str(kind) if kind else ("unreachable" if self.status == 0 else f"http_{self.status}")

    def describe(self) -> str:
        """``url (status type)``, or ``url (unreachable: how)``, for a message."""
        if self.status == 0:
            return f"{self.url} ({self.type}: {self.summary()['message']})"
        return f"{self.url} ({self.status} {self.type})"

    def summary(self) -> dict[str, Any]:
        """How a failed node is named to the caller: url, status, error type and message."""
        info = self.body.get("error") if isinstance(self.body, dict) else None
        message = info.get("message") if isinstance(info, dict) else self.body
        return {"url": self.url, "status": self.status, "type": self.type, "message": message}


@dataclass(frozen=True)
class Told:
    """One ``/weight_info`` answer of a node, as a whole: a later answer replaces it, never
    merges into it. Upstream vLLM's, which has only the label, stands for weights named by
    that label."""

    weight_version: str | None = None
    """Its label (None: it never told, or a door with no serving node)."""
    weights_id: str | None = None
    """What it holds (``tandem_wire.control.WeightInfo``); None: never told."""
    applied: tuple[int, ...] = ()
    """The sequence numbers of the updates it applied, newest first."""
    seen_seq: int = 0
    unclean: str | None = None
    unwritten: int | None = None
    transfer_ready: bool | None = None
    """Whether it can take an update now (None: it did not say)."""
    transfer_backend: str | None = None
    """How it takes updates (``nccl``, ``tandem_file``...; None: it takes none, or did not say)."""
    paused: bool | None = None
    """Its engine is paused (new requests wait until a ``/resume``); None: it did not say."""
    receiving: UpdateReceipt | None = None
    """The update under way it takes part in (None: none, or it does not tell)."""
    asked_at: float = float("-inf")
    """When (monotonic) the ask it answers was sent."""

    @classmethod
    def parse(cls, body: Any, asked_at: float) -> Told | None:
        """The answer ``body`` to an ask sent at ``asked_at``; None when it is not one."""
        if not isinstance(body, dict) or "weight_version" not in body:
            return None
        label = body["weight_version"]  # null from a door with no serving node
        label = None if label is None else str(label)
        wid = body.get("weights_id")
        seqs = body.get("applied_seqs")
        applied = tuple(s for s in seqs if is_count(s)) if isinstance(seqs, list) else ()
        seen: Any = body.get("seen_seq")
        transfer = body.get("weight_transfer")
        transfer = transfer if isinstance(transfer, dict) else {}
        ready, backend = transfer.get("ready"), transfer.get("backend")
        return cls(
            weight_version=label,
            weights_id=str(wid) if isinstance(wid, str) else f"label:{label}",
            applied=applied,
            seen_seq=seen if is_count(seen) else max(applied, default=0),
            unclean=str(body["unclean"]) if body.get("unclean") else None,
            unwritten=body.get("unwritten") if is_count(body.get("unwritten")) else None,
            transfer_ready=ready if isinstance(ready, bool) else None,
            transfer_backend=backend if isinstance(backend, str) else None,
            paused=body.get("paused") if isinstance(body.get("paused"), bool) else None,
            receiving=told_receipt(body.get("receiving")),
            asked_at=asked_at,
        )

    @property
    def newest(self) -> int:
        return self.applied[0] if self.applied else 0


NEVER_TOLD = Told()
"""What a router knows of a node that never told: nothing."""


class Reach(enum.StrEnum):
    REACHABLE = "reachable"
    COOLING = "cooling"
    """It refused or dropped a call lately: it comes last until ``down_until``."""
    GONE = "gone"
    """Unreachable past the node timeout: it has left the fleet."""


class Serving(enum.StrEnum):
    SERVING = "serving"
    PAUSED = "paused"
    """It may serve, but it missed a ``/resume``: requests go elsewhere while they can."""
    RESTARTED = "restarted"
    FENCED = "fenced"


@dataclass(frozen=True)
class NodeState:
    """A node's state as one router judges it now (``FleetView.state``)."""

    reach: Reach
    serving: Serving
    reason: str | None
    """Why it may not serve (``fleet``'s reasons; None: it may)."""
    update: str | None
    """The id of the update under way it takes part in (None: none)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "reach": str(self.reach),
            "serving": str(self.serving),
            "reason": self.reason,
            "update": self.update,
        }


@dataclass
class Node:
    """One generate (or render) node as one router process sees it. Its fields change only
    through the methods below (the transitions); ``FleetView.state`` reads them as one
    ``NodeState``."""

    url: str
    pending: int = 0
    """Requests this router has in flight on the node (render spreads by it)."""
    down_until: float = 0.0
    """Until then (monotonic clock) the node comes last: it refused a connection."""
    unreachable_since: float | None = None
    """When (monotonic) it stopped answering; None while it answers."""
    told: Told = NEVER_TOLD
    """Its newest ``/weight_info`` answer by ask time."""
    heard: bool = False
    """A ``/weight_info`` asked of it was answered or failed: until then it serves nothing."""
    seen_high: int = 0
    """The highest ``seen_seq`` it ever told this router (kept across its restarts)."""
    restarted_at: int | None = None
    """It told less than it had (a new process): every update up to this SEQ is lost on it.
    None once it applied a newer one, or while no restart was seen."""
    step_failed_at: float | None = None
    """When (monotonic) an update step failed on it: fenced until a /weight_info asked after
    that is learnt, without waiting for a poll."""
    polling: asyncio.Task[None] | None = field(default=None, repr=False, compare=False)
    """The /weight_info ask in flight (one at a time: a hung node is not asked again)."""

    # -- what it told ------------------------------------------------------------------------

    def heard_from(self, answer: NodeAnswer, asked_at: float) -> None:
        """A /weight_info answer (or failure) to an ask sent at ``asked_at`` (monotonic). Asks
        overlap (a poll, a caller's own ``/weight_info``, an update step's) and their answers
        arrive in any order: the newest by ask time is kept, on every path (an older one
        arriving late would read as a restart)."""
        self.heard = True
        told = Told.parse(answer.body, asked_at) if answer.ok else None
        if told is None or asked_at < self.told.asked_at:
            return
        self.learn(told)
        failed = self.step_failed_at
        if failed is not None and asked_at >= failed:
            self.step_failed_at = None

    def learn(self, told: Told) -> None:
        """``told`` is what the node holds now. Its record only grows (``seen_seq``;
        ``applied_seqs`` keep their newest): one that tells less than it had is a new process
        holding its checkpoint."""
        before, self.told, self.heard = self.told, told, True
        lost_newest = (
            before.newest > 0
            and before.newest not in told.applied
            and len(told.applied) < APPLIED_REPORTED
        )
        if told.seen_seq < self.seen_high or lost_newest:
            self.restarted_at = max(self.restarted_at or 0, self.seen_high, before.newest)
        if self.restarted_at is not None and told.newest > self.restarted_at:
            self.restarted_at = None  # it took an update newer than all it lost
        self.seen_high = max(self.seen_high, told.seen_seq)

    def pause_answered(self, paused: bool) -> None:
        """It answered a ``/pause`` (True) or ``/resume`` (False) 2xx: so it is now, without
        waiting for its next ``/weight_info`` (which would keep it judged as before)."""
        self.told = replace(self.told, paused=paused)

    def step_failed(self) -> None:
        """An update step failed on it: it is fenced now, until it tells what it holds."""
        self.step_failed_at = time.monotonic()

    # -- whether it answers ------------------------------------------------------------------

    def cool_down(self, now: float, seconds: float) -> None:
        """It refused or dropped a call: last for ``seconds``, unreachable from now on."""
        self.down_until = now + seconds
        if self.unreachable_since is None:
            self.unreachable_since = now

    def reached(self) -> None:
        """It answered."""
        self.unreachable_since = None

    def healthy(self) -> None:
        """It answered its ``/health`` 200: reachable, and first again."""
        self.down_until = 0.0
        self.reached()

    def gone(self, now: float, node_timeout_s: float) -> bool:
        """Unreachable for longer than the node timeout: it has left the fleet."""
        since = self.unreachable_since
        return since is not None and now - since > node_timeout_s

    def reach(self, now: float, node_timeout_s: float) -> Reach:
        if self.gone(now, node_timeout_s):
            return Reach.GONE
        return Reach.COOLING if self.down_until > now else Reach.REACHABLE

    # -- what it told, read -------------------------------------------------------------------

    @property
    def weights_id(self) -> str | None:
        return self.told.weights_id

    @property
    def weight_version(self) -> str | None:
        return self.told.weight_version

    @property
    def applied(self) -> tuple[int, ...]:
        return self.told.applied

    @property
    def paused(self) -> bool | None:
        return self.told.paused

    @property
    def update(self) -> str | None:
        """The id of the update under way it takes part in, as it told (None: none)."""
        return self.told.receiving.update_id if self.told.receiving is not None else None


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def update_seq(update_id: str) -> int:
    """The SEQ of an update id as a node told it (0: not an update id)."""
    try:
        return UpdateId.parse(update_id).seq
    except ValueError:
        return 0


def receipt_seq(receipt: UpdateReceipt) -> int:
    """The SEQ of the update a receipt is of (0: not an update id)."""
    return update_seq(receipt.update_id)


def told_receipt(told: Any) -> UpdateReceipt | None:
    """A ``receiving`` as a node told it (None: none under way, or not one)."""
    try:
        receipt = msgspec.convert(told, UpdateReceipt)
    except msgspec.ValidationError:
        return None
    return receipt if receipt_seq(receipt) else None
