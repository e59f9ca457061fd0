"""The generate fleet as a router sees it: which node may serve, node order, cool-down, and
the weight-update protocol (start -> chunks -> finish, abort), one step at a time.

One module for the front door and ``tandem_client`` (neither keeps a copy). It holds no
connection: callers pass an ``Ask`` (one HTTP call to one node) and their own ``Node`` objects
(``tandem_client.node_state``: what each told, and the transitions that change it), kept fresh
by their ``tandem_client.poller.FleetPoller``.

**Which weights are the fleet's** is judged by what each node loaded, never by its label or a
clock. Every update gets an id from whoever runs it (``tandem_wire.control.UpdateId``:
``SEQ-TOKEN``, SEQ one above the highest any node has seen start, so the fleet's updates are
ordered); each node reports at ``/weight_info`` the sequence numbers of the updates it applied
and a ``weights_id``, a digest of which update last wrote each tensor
(``tandem_generate.weight_ledger``): two nodes hold the same weights exactly when their ids are
equal. The fleet's weights are those of the reachable, clean node that applied the newest
updates (ranked newest first: the node holding an update another lacks wins); labels are for
people and decide nothing (TRL finishes an update with ``{}``, which keeps the old label).

**May a node serve** (``judge``): only when it answers, is clean (no half-applied chunk, no
prefix cache that failed to reset) and holds the fleet's ``weights_id``. A node unreachable
past the node timeout leaves the fleet: the others' weights decide without it, and it is fenced
when it comes back unless it holds theirs. A node that never told its weights serves only
while no node has. A node whose weight transfer is not set up while others' is (found after
the trainer's ``/init_weight_transfer_engine``) is fenced too: it cannot take the next update.

**An update** goes to every node that has not left the fleet. It starts on every serving node
or on none: when one fails to start, every node that may have started is undone with
``/abort_weight_update``. A node whose chunk fails is aborted too (so no finish loads what it
did not receive); it no longer holds the fleet's weights once the others finish, and the caller
gets each failing node's own answer (``NodeAnswer.summary``). Fenced nodes take part (that is
how they catch up: a leftover update of theirs is aborted first), but their failures fail
nothing; a fenced node that took a partial update stays fenced until every tensor it missed has
been written since (its ``weights_id`` then equals the others').
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tandem_wire import error_types
from tandem_wire.control import (
    APPLIED_REPORTED,
    UPDATE_ID_HEADER,
    UPDATE_RECEIVED_HEADER,
    UpdateId,
    UpdateReceipt,
)

from .node_state import (
    Node,
    NodeAnswer,
    NodeState,
    Serving,
    is_count,
    receipt_seq,
    told_receipt,
    update_seq,
)
from .routing import rendezvous_order

__all__ = [
    "ABORT_PATH",
    "COMBINE",
    "FINISH_PATH",
    "INIT_PATH",
    "LOADING_PATHS",
    "START_PATH",
    "UPDATE_PATH",
    "UPDATE_STEPS",
    "WEIGHT_INFO_PATH",
    "Ask",
    "CombineError",
    "FleetView",
    "Node",
    "NodeAnswer",
    "NodeState",
    "StepResult",
    "abort_update",
    "ask_each",
    "finish_update",
    "judge",
    "least_pending",
    "next_seq_mark",
    "poll",
    "refused_alike",
    "rendezvous_nodes",
    "send_chunk",
    "start_update",
    "learn_pausing",
    "in_update",
    "MostTaken",
    "taking_part",
]

START_PATH = "/start_weight_update"
UPDATE_PATH = "/update_weights"
FINISH_PATH = "/finish_weight_update"
ABORT_PATH = "/abort_weight_update"
INIT_PATH = "/init_weight_transfer_engine"
WEIGHT_INFO_PATH = "/weight_info"
PAUSING = {"/pause": True, "/resume": False}
"""The engine's pause routes, and whether a node that answered one 2xx is paused after it."""
UPDATE_STEPS = (START_PATH, UPDATE_PATH, FINISH_PATH, ABORT_PATH)

LOADING_PATHS = frozenset({UPDATE_PATH, FINISH_PATH, INIT_PATH})
"""Control calls that may take long on a healthy node (loading weights, a collective's
rendezvous): they get the long read timeout; every other control call the short one."""

UNREACHABLE = "unreachable"
NOT_TOLD = "weights_not_told"
OTHER_WEIGHTS = "other_weights"
UNCLEAN = "unclean"
NO_TRANSFER = "weight_transfer_not_initialized"
NOT_ASKED = "not_asked_yet"
RESTARTED = "restarted"
STEP_FAILED = "update_step_failed"


N = TypeVar("N", bound=Node)


# -- which node may serve ----------------------------------------------------------------------


@dataclass(frozen=True)
class FleetView:
    """The fleet as judged at one moment (``judge``)."""

    reference: Node | None
    """The node whose weights are the fleet's (None: no reachable clean node told any)."""
    reasons: dict[str, str | None] = field(default_factory=dict)
    """Per node URL: why it may not serve (None: it may)."""
    at: float = 0.0
    """When (monotonic) it was judged."""
    node_timeout_s: float = float("inf")

    @property
    def weights_id(self) -> str | None:
        return self.reference.weights_id if self.reference else None

    @property
    def weight_version(self) -> str | None:
        return self.reference.weight_version if self.reference else None

    def serves(self, node: Node) -> bool:
        return self.reasons.get(node.url, UNREACHABLE) is None

    def state(self, node: Node) -> NodeState:
        """The node's state as one value (``tandem_client.node_state``), as judged."""
        reason = self.reasons.get(node.url, UNREACHABLE)
        if reason is None:
            serving = Serving.PAUSED if node.paused else Serving.SERVING
        else:
            serving = Serving.RESTARTED if reason == RESTARTED else Serving.FENCED
        return NodeState(node.reach(self.at, self.node_timeout_s), serving, reason, node.update)

    def fenced(self, nodes: Sequence[N]) -> list[N]:
        return [n for n in nodes if not self.serves(n)]

    def missed(self, node: Node) -> list[int]:
        """The fleet's updates a node did not apply (as far as both report), newest first."""
        if self.reference is None:
            return []
        have = set(node.applied)
        # A full list is cut at its oldest: what came before it is not known.
        known_from = min(have) if len(have) >= APPLIED_REPORTED else 0
        return [s for s in self.reference.applied if s not in have and s > known_from]


def judge(nodes: Sequence[Node], now: float, node_timeout_s: float) -> FleetView:
    """Which weights are the fleet's and which nodes may serve (see the module doc)."""
    live = [n for n in nodes if not n.gone(now, node_timeout_s)]
    told = [n for n in live if n.weights_id is not None]
    clean = [n for n in told if n.told.unclean is None and n.step_failed_at is None]
    holders: dict[str | None, int] = {}
    for n in clean:
        holders[n.weights_id] = holders.get(n.weights_id, 0) + 1
    # A restarted node holds its checkpoint, not the updates it lost: it never decides.
    whole = [n for n in clean if n.restarted_at is None]
    # Newest updates first; then the weights most nodes hold; then the id, so that every router
    # picks the same node from the same answers.
    reference = max(
        whole, key=lambda n: (n.applied, holders[n.weights_id], n.weights_id or ""), default=None
    )
    # Backends whose trainer's group is set up on some node (a node of the same backend that is
    # not in it was found later: it can take no update).
    set_up = {n.told.transfer_backend for n in told if n.told.transfer_ready}
    alive = set(map(id, live))
    reasons = {n.url: _reason(n, id(n) in alive, reference, bool(told), set_up) for n in nodes}
    return FleetView(reference, reasons, now, node_timeout_s)


def _reason(
    n: Node, alive: bool, reference: Node | None, any_told: bool, set_up: set[str | None]
) -> str | None:
    if not alive:
        return UNREACHABLE
    if not n.heard:
        return NOT_ASKED
    if n.step_failed_at is not None:
        return STEP_FAILED
    if n.weights_id is None:
        return NOT_TOLD if any_told else None
    if n.told.unclean is not None:
        return f"{UNCLEAN}: {n.told.unclean}"
    if (
        n.told.transfer_ready is False
        and n.told.transfer_backend is not None
        and n.told.transfer_backend in set_up
    ):
        return NO_TRANSFER
    if reference is None or n.weights_id != reference.weights_id:
        return RESTARTED if n.restarted_at is not None else OTHER_WEIGHTS
    return None


def rendezvous_nodes(key: str, nodes: Sequence[N], view: FleetView, now: float) -> list[N]:
    """The nodes that may serve in ``key``'s rendezvous order (the same on every router),
    those that failed recently last. A node going away moves only its keys. A paused node
    (it missed a ``/resume``) gets nothing while one that may serve is not paused: a request
    there would wait until someone resumes it."""
    serving = [n for n in nodes if view.serves(n)]
    awake = [n for n in serving if not n.paused]
    if all(n.down_until > now for n in awake):
        # Every awake one refused lately (died since it last told): a paused one holds the
        # request until its resume, where those would refuse it.
        awake = []
    by_url = {n.url: n for n in awake or serving}
    order = [by_url[u] for u in rendezvous_order(key, list(by_url))]
    return sorted(order, key=lambda n: n.down_until > now)


def least_pending(nodes: Sequence[N], now: float) -> list[N]:
    """Nodes least pending first (ties broken at random), unreachable ones last."""
    shuffled = list(nodes)
    random.shuffle(shuffled)
    return sorted(shuffled, key=lambda n: (n.down_until > now, n.pending))


# -- asking nodes ------------------------------------------------------------------------------


Ask = Callable[[Node, str, str, bytes, Mapping[str, str]], Awaitable[NodeAnswer]]
"""One call to one node: (node, method, path with query, body, extra headers) -> its answer;
a node that cannot be reached answers status 0 (and the caller cools it down)."""


async def ask_each(
    ask: Ask,
    nodes: Sequence[Node],
    method: str,
    path: str,
    bodies: Sequence[bytes] | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[NodeAnswer]:
    """Every node at once, each with its body (none by default); answers in the nodes' order."""
    sent = bodies if bodies is not None else [b""] * len(nodes)
    calls = (ask(n, method, path, b, headers or {}) for n, b in zip(nodes, sent, strict=True))
    return list(await asyncio.gather(*calls))


async def poll(
    ask: Ask,
    nodes: Sequence[Node],
    wait_s: float | None = None,
    learnt: Callable[[Node], None] | None = None,
) -> None:
    """Ask ``nodes`` their ``/weight_info`` at once, each answer learnt as it arrives (then
    ``learnt(node)``), so a hung node delays no other's: it keeps its last state until its
    ask times out (the caller's ``Ask`` cools it down: it is on its way to unreachable). A
    node whose last ask is still in flight is not asked again. Waits for the answers at most
    ``wait_s`` (None: until each answered or timed out); late ones are learnt when they come."""

    async def one(node: Node) -> None:
        asked_at = time.monotonic()
        node.heard_from(await ask(node, "GET", WEIGHT_INFO_PATH, b"", {}), asked_at)
        if learnt is not None:
            learnt(node)

    for n in nodes:
        if n.polling is None or n.polling.done():
            n.polling = asyncio.ensure_future(one(n))
    pending = {n.polling for n in nodes if n.polling is not None}
    if pending:
        await asyncio.wait(pending, timeout=wait_s)


def next_seq_mark(mark: int, nodes: Sequence[Node]) -> int:
    """The highest SEQ a router knows of: its own ``mark`` (every id it minted and every
    ``seen_seq`` it was told, by nodes that left or restarted too) and the nodes' now."""
    return max([mark, *(max(n.told.seen_seq, n.seen_high) for n in nodes)])


# -- the update protocol, one step at a time ---------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """One step of an update on the nodes asked (answers in their order)."""

    asked: list[Node]
    answers: list[NodeAnswer]
    failures: list[NodeAnswer]
    """The failures that fail the step: of nodes that served when it began."""
    refusal: NodeAnswer | None = None
    """Every node asked refused it alike (same status): their answer, to pass on as it is."""
    update_id: UpdateId | None = None

    @property
    def succeeded(self) -> list[Node]:
        return [n for n, a in zip(self.asked, self.answers, strict=True) if a.ok]


def learn_pausing(path: str, nodes: Sequence[Node], answers: Sequence[NodeAnswer]) -> None:
    """What a ``/pause`` or ``/resume`` (``path``, its query included) did to each node that
    answered it 2xx, learnt now: until its next ``/weight_info`` the node would be judged by
    what it told before (resumed nodes as paused, sending requests to one that missed it)."""
    paused = PAUSING.get(path.split("?")[0])
    if paused is None:
        return
    for node, answer in zip(nodes, answers, strict=True):
        if answer.ok:
            node.pause_answered(paused)


def taking_part(nodes: Sequence[N], now: float, node_timeout_s: float) -> list[N]:
    """The nodes an update's start goes to: every node that has not left the fleet."""
    return [n for n in nodes if not n.gone(now, node_timeout_s)]


def in_update(nodes: Sequence[N], told_since: float) -> list[N]:
    """The nodes a chunk or a finish goes to, for a router that keeps nothing between steps
    (the door): those taking part in the newest update under way, as they told. A node that
    told since ``told_since`` that it takes no part in it missed its start (it had left the
    fleet, or discovery found it since): it would refuse the step, failing the trainer's
    update on nodes that all took it; left out, it stays fenced until it applies a later
    update. One that did not tell since is asked (it may have started). When no node tells
    an update under way (upstream vLLM's nodes do not), every node is asked."""
    ids = [n.update for n in nodes if n.update is not None]
    if not ids:
        return list(nodes)
    newest = max(ids, key=update_seq)
    return [n for n in nodes if n.told.asked_at < told_since or n.update == newest]


def _result(
    asked: Sequence[Node], answers: list[NodeAnswer], view: FleetView, **extra: Any
) -> StepResult:
    failures = [a for n, a in zip(asked, answers, strict=True) if not a.ok and view.serves(n)]
    return StepResult(list(asked), answers, failures, refused_alike(answers), **extra)


def refused_alike(answers: Sequence[NodeAnswer]) -> NodeAnswer | None:
    """The answer to pass on when every node refused the same way (the same status: a bad
    body, no such route, no key, a file checked against the same model), else None."""
    alike = bool(answers) and not any(a.ok for a in answers)
    alike = alike and len({a.status for a in answers}) == 1 and answers[0].status != 0
    return answers[0] if alike else None


MINT_ATTEMPTS = 3
"""Starts tried, each with an id minted above the SEQs the nodes refused it for: a router
racing another for the next SEQ is not refused for ever, one that keeps losing is told so."""


def _seen_seq(answer: NodeAnswer) -> int:
    """The ``seen_seq`` a ``weight_update_seq_seen`` refusal tells (0: it does not)."""
    info = answer.body.get("error") if isinstance(answer.body, dict) else None
    details = info.get("details") if isinstance(info, dict) else None
    seen: Any = details.get("seen_seq") if isinstance(details, dict) else None
    return int(seen) if is_count(seen) else 0


async def start_update(
    ask: Ask, nodes: Sequence[Node], view: FleetView, seq_mark: int = 0
) -> StepResult:
    """``/start_weight_update`` with a new update id on ``nodes``, its SEQ above ``seq_mark``
    (the caller's ``next_seq_mark``: nodes that left or restarted forget what they saw) and
    every SEQ the nodes saw; when a serving node fails to start, every node that may have
    started is undone (``/abort_weight_update``), so none is left mid-update."""
    behind = view.fenced(nodes)
    # A fenced node may be left mid-update by the update it failed: ended, so it can join.
    await ask_each(ask, behind, "POST", ABORT_PATH)
    for _ in range(MINT_ATTEMPTS):
        uid = UpdateId.mint(next_seq_mark(seq_mark, nodes))
        headers = {UPDATE_ID_HEADER: str(uid)}
        answers = await ask_each(ask, nodes, "POST", START_PATH, headers=headers)
        seen = [_seen_seq(a) for a in answers if a.type == error_types.WEIGHT_UPDATE_SEQ_SEEN]
        if not seen:
            break
        # Another router minted this SEQ (this one counted from a stale view): minted again
        # above what the refusing nodes saw; the nodes that took this id end it at the newer
        # start, as they end any update a newer one outdates.
        seq_mark = max(seq_mark, uid.seq, *seen)
    result = _result(nodes, answers, view, update_id=uid)
    if result.failures:
        # Undone wherever it may have started: a node that timed out or failed with a 5xx
        # may have started all the same; only a 4xx refusal surely did not.
        maybe = [n for n, a in zip(nodes, answers, strict=True) if not 400 <= a.status < 500]
        await ask_each(ask, maybe, "POST", ABORT_PATH)
    return result


async def send_chunk(
    ask: Ask, nodes: Sequence[Node], view: FleetView, body: bytes, headers: Mapping[str, str]
) -> StepResult:
    """One ``/update_weights`` chunk to ``nodes``. A node whose chunk failed (or timed out: it
    may still be loading it) is aborted, so that no finish loads what it did not receive;
    when every node refused it alike (the same file checked against the same model), every
    node is aborted and their refusal is the answer."""
    answers = await ask_each(ask, nodes, "POST", UPDATE_PATH, [body] * len(nodes), headers)
    result = _result(nodes, answers, view)
    dropped = [n for n, a in zip(nodes, answers, strict=True) if not a.ok]
    await ask_each(ask, dropped, "POST", ABORT_PATH)
    return result


async def finish_update(
    ask: Ask,
    nodes: Sequence[Node],
    view: FleetView,
    body: bytes,
    headers: Mapping[str, str],
    sent: UpdateReceipt | None = None,
) -> StepResult:
    """``/finish_weight_update`` on ``nodes`` (each loads, resets its caches and relabels with
    its engine frozen). Each answer is judged as it arrives, not once the slowest node
    answered: a node that failed it is fenced at once, one that finished is asked what it
    holds now (so the nodes still loading are fenced behind it).

    Each node is told what it must have taken (``UPDATE_RECEIVED_HEADER``): one that took
    other chunks (a chunk and its abort were lost on the way) refuses and ends the update, so
    only nodes that took every chunk load it. ``sent``: the caller's own receipt; None when it
    kept none (a trainer through the door, which keeps nothing between steps): then it is
    what the node that took the most chunks of the newest update under way took, asked now."""
    if sent is None:
        told = await ask_each(ask, nodes, "GET", WEIGHT_INFO_PATH)
        taken = _most_taken(told)
        if taken.split:
            return await _finish_nowhere(ask, nodes, view, told)
        sent = taken.receipt
    if sent is not None:
        headers = {**headers, UPDATE_RECEIVED_HEADER: sent.header()}
    answers = await ask_each(
        _judging(ask), nodes, "POST", FINISH_PATH, [body] * len(nodes), headers
    )
    return _result(nodes, answers, view)


@dataclass(frozen=True)
class MostTaken:
    """What the nodes took of the newest update under way, as their ``/weight_info`` tells."""

    receipt: UpdateReceipt | None = None
    """What the node that took the most chunks took: every node must hold it to load the
    update (None: no node tells an update under way; they finish as vLLM's do)."""
    split: bool = False
    """Two nodes took different chunks, as many of them: none is known to hold every chunk."""


def _most_taken(answers: Sequence[NodeAnswer]) -> MostTaken:
    """What the node that took the most chunks of the newest update under way took, from
    ``/weight_info`` answers."""
    receipts = []
    for a in answers:
        receipt = (
            told_receipt(a.body.get("receiving")) if a.ok and isinstance(a.body, dict) else None
        )
        if receipt is not None:
            receipts.append(receipt)
    if not receipts:
        return MostTaken()
    newest = max(map(receipt_seq, receipts))
    of_newest = [r for r in receipts if receipt_seq(r) == newest]
    most = max(r.chunks for r in of_newest)
    whole = {r for r in of_newest if r.chunks == most}
    return MostTaken(whole.pop()) if len(whole) == 1 else MostTaken(split=True)


async def _finish_nowhere(
    ask: Ask, nodes: Sequence[Node], view: FleetView, told: Sequence[NodeAnswer]
) -> StepResult:
    """No node is known to have taken every chunk: none loads the update; it is ended on each
    node that is updating, and each node is named as refusing the finish."""
    updating = [
        n
        for n, a in zip(nodes, told, strict=True)
        if a.ok and isinstance(a.body, dict) and a.body.get("receiving")
    ]
    await ask_each(ask, updating, "POST", ABORT_PATH)
    error = {
        "type": error_types.WEIGHT_UPDATE_INCOMPLETE,
        "message": "the nodes took different chunks of the update (chunks and their aborts "
        "were lost on the way): none is known to hold all of it, so it is loaded nowhere",
    }
    answers = [NodeAnswer(n.url, 409, {"error": error}) for n in nodes]
    return _result(nodes, answers, view)


def _judging(ask: Ask) -> Ask:
    """``ask`` for an update step whose answer changes what the node holds."""

    async def judged(
        node: Node, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> NodeAnswer:
        answer = await ask(node, method, path, body, headers)
        if not answer.ok:
            node.step_failed()
        else:
            await poll(ask, [node])
        return answer

    return judged


async def abort_update(ask: Ask, nodes: Sequence[Node], view: FleetView) -> StepResult:
    """``/abort_weight_update`` on ``nodes``."""
    return _result(nodes, await ask_each(ask, nodes, "POST", ABORT_PATH), view)


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


Combine = Callable[[list[NodeAnswer], Sequence[Node], FleetView], Any]
"""(every node's answer, the nodes in the same order, the fleet as judged) -> one answer."""


def _first(answers: list[NodeAnswer], nodes: Sequence[Node], view: FleetView) -> Any:
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


def _any_paused(answers: list[NodeAnswer], nodes: Sequence[Node], view: FleetView) -> Any:
    """Paused when any node is; an error when one does not tell (a trainer waiting for the
    fleet to be quiet must not take an unreachable node for an idle one)."""
    told = _told(answers, "/is_paused", "is_paused", lambda v: isinstance(v, bool))
    return {"is_paused": any(told)}


def _world_size(answers: list[NodeAnswer], nodes: Sequence[Node], view: FleetView) -> Any:
    """The sum over every node; an error when one does not tell (a node missing from the
    count would give the trainer a group that never completes)."""
    told = _told(
        answers,
        "/get_world_size",
        "world_size",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    )
    return {"world_size": sum(told)}


def _weight_versions(answers: list[NodeAnswer], nodes: Sequence[Node], view: FleetView) -> Any:
    """The fleet's weights (label, ``weights_id``, the updates they hold) and every node's own,
    with whether it is fenced and why (a node that did not answer: as last known)."""
    listed = [
        {
            "url": n.url,
            "weight_version": n.weight_version,
            "weights_id": n.weights_id,
            "update_seq": n.applied[0] if n.applied else 0,
            "fenced": not view.serves(n),
            "reason": view.reasons.get(n.url, UNREACHABLE),
            "missed_seqs": view.missed(n),
            "paused": n.paused,
            "state": view.state(n).to_dict(),
            **({"unwritten": n.told.unwritten} if n.told.unclean else {}),
        }
        for n in nodes
    ]
    ref = view.reference
    return {
        "weight_version": view.weight_version,
        "weights_id": view.weights_id,
        "applied_seqs": list(ref.applied) if ref else [],
        "seen_seq": next_seq_mark(0, nodes),
        "nodes": listed,
        "fenced": [n["url"] for n in listed if n["fenced"]],
    }


def _each(answers: list[NodeAnswer], nodes: Sequence[Node], view: FleetView) -> Any:
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
