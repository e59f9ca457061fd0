"""Control routes: each goes to every generate node, answers combined as the route table says.

The table is ``tandem_wire.control.CONTROL_ROUTES``; the rules (combining, fencing, an update
that starts everywhere or nowhere) are ``tandem_client.fleet``'s. A state-changing route is 200
only when every node it must reach answered 2xx, else ``control_partial_failure`` naming each
node that failed with its own status and error type. So is ``/get_world_size``; a fleet is
paused if any node is; ``/weight_info`` lists every node's version and which are fenced;
server info is the first node's that answers (asked one node at a time).
``/init_weight_transfer_engine`` gives each node its own NCCL ranks (see ``ranks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem_client import fleet
from tandem_client.fleet import COMBINE, CombineError, NodeAnswer
from tandem_wire import error_types
from tandem_wire.control import ControlRoute

from . import ranks
from .errors import ControlPartialFailure, FrontError, UpstreamError, UpstreamUnavailable
from .upstreams import Node, Upstreams

__all__ = ["fan_out"]

INIT_PATH = "/init_weight_transfer_engine"
WORLD_SIZE_PATH = "/get_world_size"
_UPDATE_STEPS = (fleet.START_PATH, fleet.UPDATE_PATH, fleet.FINISH_PATH, fleet.ABORT_PATH)


async def _init_bodies(ask: fleet.Ask, body: bytes, nodes: Sequence[Node]) -> list[bytes]:
    """Each node's ``/init_weight_transfer_engine`` body: its own ``rank_offset`` from the
    world sizes the nodes tell now (see ``ranks``); nothing is sent when one does not tell."""
    doc = ranks.ranked_init(body)
    if doc is None:
        return [body] * len(nodes)
    path = f"{WORLD_SIZE_PATH}?include_dp=true"
    answers = await fleet.fan_out(ask, nodes, "GET", path, [b""] * len(nodes))
    try:
        COMBINE["world_size"](answers, nodes)  # every node told one, or refused here
    except CombineError as exc:
        raise _combine_error(exc, f"{INIT_PATH} was sent to no node: ") from None
    sizes = [a.body["world_size"] for a in answers]
    return ranks.per_node_bodies(doc, [n.url for n in nodes], sizes)


async def fan_out(
    upstreams: Upstreams,
    route: ControlRoute,
    params: str,
    headers: dict[str, str],
    body: bytes,
    nodes: Sequence[Node],
) -> tuple[int, Any]:
    """Send the request to ``nodes`` (in the configured order of ``--generate`` URLs) at once;
    (status, body) of the combined answer (see the module doc). Nodes that all refuse the same
    way have their refusal passed on."""
    if not nodes:
        raise UpstreamUnavailable("no generate node is configured")
    query = f"?{params}" if params else ""
    # The bodies may differ in length (per-node ranks); httpx counts each.
    sent = {k: v for k, v in headers.items() if k != "content-length"}
    asked = {k: v for k, v in sent.items() if k != "content-type"}

    async def ask(node: fleet.Node, method: str, path: str, content: bytes) -> NodeAnswer:
        return await upstreams.ask(node, method, path, content, sent if content else asked)

    path = route.path
    if path in _UPDATE_STEPS:
        # Fencing is judged on what the nodes hold as the step begins.
        await upstreams.refresh_versions()
    if path == fleet.START_PATH:
        answers = await fleet.start_everywhere(ask, nodes)
    elif route.combine == "first":
        answers = await _until_one_answers(ask, nodes, route.method, path + query)
    else:
        bodies = await _init_bodies(ask, body, nodes) if path == INIT_PATH else [body] * len(nodes)
        answers = await fleet.fan_out(ask, nodes, route.method, path + query, bodies)
    if path == fleet.UPDATE_PATH:
        # A node whose chunk failed (or timed out: it may still be loading it) is left
        # mid-update no longer, so a finish cannot label what it did not load.
        dropped = [n for n, a in zip(nodes, answers, strict=True) if not a.ok]
        await fleet.fan_out(ask, dropped, "POST", fleet.ABORT_PATH, [b""] * len(dropped))
    if path == fleet.WEIGHT_INFO_PATH:
        upstreams.learn_versions(nodes, answers)
    failed = [a for a in answers if not a.ok]
    ok = [a for a in answers if a.ok]
    if failed and not ok and len({a.status for a in failed}) == 1 and failed[0].status:
        # Every node refused the same way (bad body, no such route, no key): their answer.
        return failed[0].status, failed[0].body
    if path in _UPDATE_STEPS:
        fenced_before = [n.url for n in fleet.fenced(nodes)]
        must = fleet.update_failures(nodes, answers)
        if path in (fleet.FINISH_PATH, fleet.ABORT_PATH):
            await upstreams.refresh_versions()  # this worker fences at once
        _refuse_update(path, must, answers, nodes, fenced_before)
    elif route.changes_state:
        _refuse_update(path, failed, answers, nodes, [])
    try:
        if not ok and path != fleet.WEIGHT_INFO_PATH:
            raise UpstreamUnavailable(f"{path}: no generate node answered it")
        return 200, COMBINE[route.combine](answers, nodes)
    except CombineError as exc:
        raise _combine_error(exc) from None


async def _until_one_answers(
    ask: fleet.Ask, nodes: Sequence[Node], method: str, path: str
) -> list[NodeAnswer]:
    """For a route whose answer is one node's: the nodes asked in order until one answers
    2xx, not the whole fleet at once for answers that would be dropped."""
    answers: list[NodeAnswer] = []
    for node in nodes:
        answers.append(await ask(node, method, path, b""))
        if answers[-1].ok:
            break
    return answers


def _combine_error(exc: CombineError, prefix: str = "") -> FrontError:
    kind = UpstreamError if exc.type == error_types.UPSTREAM_ERROR else ControlPartialFailure
    return kind(prefix + exc.message, details={"failed": exc.failed, "succeeded": exc.succeeded})


def _refuse_update(
    path: str,
    failed: list[NodeAnswer],
    answers: list[NodeAnswer],
    nodes: Sequence[Node],
    fenced_before: list[str],
) -> None:
    """A state-changing step that failed on nodes (for an update step: nodes not fenced
    before it): each one's own answer, and which nodes are fenced now."""
    if not failed:
        return
    names = ", ".join(a.describe() for a in failed)
    undone = ""
    if path == fleet.START_PATH:
        undone = " (undone on every node that started: none is updating)"
    raise ControlPartialFailure(
        f"{path} failed on {len(failed)} of {len(answers)} generate nodes: {names}{undone}",
        details={
            "failed": [a.summary() for a in failed],
            "succeeded": [a.url for a in answers if a.ok],
            "weight_version": fleet.fleet_version(nodes),
            "fenced": [n.url for n in fleet.fenced(nodes)],
            "fenced_before": fenced_before,
        },
    )
