"""The generate fleet as a router sees it: node order, cool-down, fencing, fan-out, combining.

One module for the front door and ``tandem_client`` (neither keeps a copy). It holds no
connection: callers pass an ``Ask`` (one HTTP call to one node) and their own ``Node`` objects.

**The fleet's version** is the label of the newest update any node finished: each generate
node reports at ``/weight_info`` its ``weight_version`` and ``updated_at`` (its wall clock
when it last finished an update or was relabelled; null since it started). So the last fully
successful update sets it, and so does an update that finished on some nodes only (those hold
its weights now). While no node has been updated (or after every node restarted), it is the
version all nodes agree on; nodes that disagree then have no fleet version and nobody is
fenced. The nodes' clocks are assumed to agree within the time between two updates (NTP).

**Fencing:** a node that reported a version other than the fleet's gets no inference work
(it failed an update others finished, or restarted with its checkpoint) until it reports the
fleet's version, i.e. until an update reaches it. A node that never answered ``/weight_info``
is not fenced (a node that cannot be reached cools down instead). Requests never go to a
fenced node, even when no other node is up: its completions would be of other weights.

**An update** (``/start_weight_update`` -> ``/update_weights`` -> ``/finish_weight_update``)
goes to every node. It starts on every unfenced node or on none: when one fails to start,
every node that may have started is undone with ``/abort_weight_update``. A node whose chunk
fails is aborted too (so no finish labels what it did not load); it is fenced once the others
finish, and the caller gets each failing node's own answer (``NodeAnswer.summary``: url,
status, error type, message). Fenced nodes take part too (that is how they catch up: a
leftover update of theirs is aborted first), but their failures fail nothing.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tandem_wire import error_types

from .routing import rendezvous_order

__all__ = [
    "ABORT_PATH",
    "COMBINE",
    "FINISH_PATH",
    "START_PATH",
    "UPDATE_PATH",
    "WEIGHT_INFO_PATH",
    "Ask",
    "CombineError",
    "Node",
    "NodeAnswer",
    "fan_out",
    "fenced",
    "fleet_version",
    "least_pending",
    "rendezvous_nodes",
    "start_everywhere",
    "told_versions",
    "update_failures",
]

START_PATH = "/start_weight_update"
UPDATE_PATH = "/update_weights"
FINISH_PATH = "/finish_weight_update"
ABORT_PATH = "/abort_weight_update"
WEIGHT_INFO_PATH = "/weight_info"


@dataclass
class Node:
    """One generate (or render) node as one router process sees it."""

    url: str
    pending: int = 0
    """Requests this router has in flight on the node (render spreads by it)."""
    down_until: float = 0.0
    """Until then (monotonic clock) the node comes last: it refused a connection."""
    weight_version: str | None = None
    """The version it last reported at /weight_info (None: it never answered)."""
    updated_at: float | None = None
    """Its wall clock when it last finished an update, as it reported (None: not since it
    started, so it holds its checkpoint's weights or whatever it was started with)."""

    def learn(self, weight_info: Any) -> bool:
        """Take a /weight_info answer; False when it is not one."""
        if not isinstance(weight_info, dict) or "weight_version" not in weight_info:
            return False
        told = weight_info["weight_version"]  # null from a door whose nodes disagree
        self.weight_version = None if told is None else str(told)
        at = weight_info.get("updated_at")
        self.updated_at = float(at) if isinstance(at, int | float) else None
        return True

    def cool_down(self, now: float, seconds: float) -> None:
        self.down_until = now + seconds


N = TypeVar("N", bound=Node)


def fleet_version(nodes: Sequence[Node]) -> str | None:
    """The fleet's version (see the module doc), None when there is none."""
    told = [n for n in nodes if n.weight_version is not None]
    stamped = [n for n in told if n.updated_at is not None]
    if stamped:
        return max(stamped, key=lambda n: n.updated_at or 0.0).weight_version
    versions = {n.weight_version for n in told}
    return versions.pop() if len(versions) == 1 else None


def told_versions(answers: Sequence[NodeAnswer]) -> dict[str, str | None]:
    """Each node's version from its ``/weight_info`` answer (None: no readable answer)."""
    out: dict[str, str | None] = {}
    for a in answers:
        told = a.body.get("weight_version") if a.ok and isinstance(a.body, dict) else None
        out[a.url] = None if told is None else str(told)
    return out


def fenced(nodes: Sequence[N]) -> list[N]:
    """The nodes that get no inference work: they reported another version than the fleet's."""
    version = fleet_version(nodes)
    if version is None:
        return []
    return [n for n in nodes if n.weight_version is not None and n.weight_version != version]


def rendezvous_nodes(key: str, nodes: Sequence[N], now: float) -> list[N]:
    """Unfenced nodes in ``key``'s rendezvous order (the same on every router), those that
    refused a connection recently last. A node going away moves only its keys."""
    out = set(map(id, fenced(nodes)))
    by_url = {n.url: n for n in nodes if id(n) not in out}
    order = [by_url[u] for u in rendezvous_order(key, list(by_url))]
    return sorted(order, key=lambda n: n.down_until > now)


def least_pending(nodes: Sequence[N], now: float) -> list[N]:
    """Nodes least pending first (ties broken at random), unreachable ones last."""
    shuffled = list(nodes)
    random.shuffle(shuffled)
    return sorted(shuffled, key=lambda n: (n.down_until > now, n.pending))


# -- fan-out -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeAnswer:
    """What one node said (``status`` 0: it could not be reached, ``body`` says how)."""

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
            return f"{self.url} (unreachable: {self.body})"
        return f"{self.url} ({self.status} {self.type})"

    def summary(self) -> dict[str, Any]:
        """How a failed node is named to the caller: url, status, error type and message."""
        info = self.body.get("error") if isinstance(self.body, dict) else None
        message = info.get("message") if isinstance(info, dict) else self.body
        return {"url": self.url, "status": self.status, "type": self.type, "message": message}


Ask = Callable[[Node, str, str, bytes], Awaitable[NodeAnswer]]
"""One call to one node: (node, method, path with query, body) -> its answer; a node that
cannot be reached answers status 0 (the caller also cools it down)."""


async def fan_out(
    ask: Ask, nodes: Sequence[Node], method: str, path: str, bodies: Sequence[bytes]
) -> list[NodeAnswer]:
    """Every node at once, each with its body; answers in the nodes' order."""
    calls = (ask(n, method, path, b) for n, b in zip(nodes, bodies, strict=True))
    return list(await asyncio.gather(*calls))


async def start_everywhere(ask: Ask, nodes: Sequence[Node]) -> list[NodeAnswer]:
    """``/start_weight_update`` on every node; when an unfenced node fails to start, every node
    that may have started is undone (``/abort_weight_update``), so none is left mid-update.
    The answers, in the nodes' order (the failures among them are the caller's to report)."""
    behind = fenced(nodes)
    # A fenced node may be left mid-update by the update it failed: ended, so it can join.
    await fan_out(ask, behind, "POST", ABORT_PATH, [b""] * len(behind))
    out = set(map(id, behind))
    answers = await fan_out(ask, nodes, "POST", START_PATH, [b""] * len(nodes))
    if any(not a.ok and id(n) not in out for n, a in zip(nodes, answers, strict=True)):
        # Undone wherever it may have started: a node that timed out or failed with a 5xx
        # may have started all the same; only a 4xx refusal surely did not.
        maybe = [n for n, a in zip(nodes, answers, strict=True) if not 400 <= a.status < 500]
        await fan_out(ask, maybe, "POST", ABORT_PATH, [b""] * len(maybe))
    return answers


def update_failures(nodes: Sequence[Node], answers: Sequence[NodeAnswer]) -> list[NodeAnswer]:
    """The failures that fail an update step: those of nodes not fenced before it (a fenced
    node that cannot follow stays fenced)."""
    out = set(map(id, fenced(nodes)))
    return [a for n, a in zip(nodes, answers, strict=True) if not a.ok and id(n) not in out]


# -- combining answers ---------------------------------------------------------------------------


class CombineError(Exception):
    """The answers cannot be combined: ``type`` ``control_partial_failure`` when a node that
    must answer did not, ``upstream_error`` when one answered without what is asked."""

    def __init__(
        self, message: str, failed: list[dict[str, Any]], succeeded: list[str], type: str
    ) -> None:
        super().__init__(message)
        self.message = message
        self.failed = failed
        self.succeeded = succeeded
        self.type = type


Combine = Callable[[list[NodeAnswer], Sequence[Node]], Any]
"""(every node's answer, the nodes in the same order) -> the combined answer."""


def _first(answers: list[NodeAnswer], nodes: Sequence[Node]) -> Any:
    ok = [a for a in answers if a.ok]
    return ok[0].body if ok else None


def _told(
    answers: list[NodeAnswer], path: str, field: str, valid: Callable[[Any], bool]
) -> list[Any]:
    """Every node's ``field``; an error naming the nodes that did not tell (unreachable,
    refused, or an answer without a valid value), so no node is silently left out."""
    told, failed, succeeded = [], [], []
    for a in answers:
        value = a.body.get(field) if a.ok and isinstance(a.body, dict) else None
        if not valid(value):
            failed.append(a.summary())
        else:
            told.append(value)
            succeeded.append(a.url)
    if failed:
        names = ", ".join(f"{f['url']} ({f['status'] or 'unreachable'})" for f in failed)
        junk = all(200 <= f["status"] < 300 for f in failed)
        kind = error_types.UPSTREAM_ERROR if junk else error_types.CONTROL_PARTIAL_FAILURE
        raise CombineError(f"{path}: no {field} from {names}", failed, succeeded, kind)
    return told


def _any_paused(answers: list[NodeAnswer], nodes: Sequence[Node]) -> Any:
    """Paused when any node is; an error when one does not tell (a trainer waiting for the
    fleet to be quiet must not take an unreachable node for an idle one)."""
    told = _told(answers, "/is_paused", "is_paused", lambda v: isinstance(v, bool))
    return {"is_paused": any(told)}


def _world_size(answers: list[NodeAnswer], nodes: Sequence[Node]) -> Any:
    """The sum over every node; an error when one does not tell (a node missing from the
    count would give the trainer a group that never completes)."""
    told = _told(
        answers,
        "/get_world_size",
        "world_size",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    )
    return {"world_size": sum(told)}


def _weight_versions(answers: list[NodeAnswer], nodes: Sequence[Node]) -> Any:
    """The fleet's version (null when there is none) and every node's own, fenced or not
    (a node that did not answer: its version null, fenced as last known)."""
    out = {id(n) for n in fenced(nodes)}
    listed = [
        {
            "url": a.url,
            "weight_version": a.body.get("weight_version")
            if a.ok and isinstance(a.body, dict)
            else None,
            "fenced": id(n) in out,
        }
        for n, a in zip(nodes, answers, strict=True)
    ]
    return {
        "weight_version": fleet_version(nodes),
        "nodes": listed,
        "fenced": [n["url"] for n in listed if n["fenced"]],
    }


def _each(answers: list[NodeAnswer], nodes: Sequence[Node]) -> Any:
    # Every node's own answer, plus the first one's fields for clients reading one node's shape.
    first = answers[0].body if answers and isinstance(answers[0].body, dict) else {}
    return {**first, "nodes": [{"url": a.url, "body": a.body} for a in answers]}


COMBINE: dict[str, Combine] = {
    "each": _each,
    "first": _first,
    "any_paused": _any_paused,
    "world_size": _world_size,
    "weight_versions": _weight_versions,
}
"""How per-node answers become one, by the name ``tandem_wire.control.CONTROL_ROUTES`` gives."""
