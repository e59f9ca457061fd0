"""Control routes: each goes to every generate node, answers combined as the route table says.

The table is ``tandem_wire.control.CONTROL_ROUTES``; the rules (which node may serve, the
update protocol's steps, combining) are ``tandem_client.fleet``'s. A state-changing route is 200
only when every node it must reach answered 2xx, else ``control_partial_failure`` naming each
node that failed with its own status and error type. So is ``/get_world_size``; a fleet is
paused if any node is; ``/weight_info`` lists every node's weights and which are fenced, and
why; server info is the first node's that answers (asked one node at a time).
``/init_weight_transfer_engine`` gives each node its own NCCL ranks (see ``ranks``). Every
route but ``/weight_info`` goes to the nodes that have not left the fleet (unreachable past
``--node-timeout-s``), and only the nodes that served when an update's step began can fail it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tandem_client import fleet
from tandem_client.fleet import COMBINE, CombineError, NodeAnswer
from tandem_wire import error_types
from tandem_wire.control import ControlRoute

from . import ranks
from .errors import ControlPartialFailure, FrontError, UpstreamError, UpstreamUnavailable
from .upstreams import Node, Upstreams

__all__ = ["relay"]

WORLD_SIZE_PATH = "/get_world_size"


async def _init_bodies(
    ask: fleet.Ask, body: bytes, nodes: Sequence[Node], view: fleet.FleetView
) -> list[bytes]:
    """Each node's ``/init_weight_transfer_engine`` body: its own ``rank_offset`` from the
    world sizes the nodes tell now (see ``ranks``); nothing is sent when one does not tell."""
    doc = ranks.ranked_init(body)
    if doc is None:
        return [body] * len(nodes)
    answers = await fleet.ask_each(ask, nodes, "GET", f"{WORLD_SIZE_PATH}?include_dp=true")
    try:
        COMBINE["world_size"](answers, nodes, view)  # every node told one, or refused here
    except CombineError as exc:
        raise _combine_error(exc, f"{fleet.INIT_PATH} was sent to no node: ") from None
    sizes = [a.body["world_size"] for a in answers]
    return ranks.per_node_bodies(doc, [n.url for n in nodes], sizes)


async def relay(
    upstreams: Upstreams,
    route: ControlRoute,
    params: str,
    headers: dict[str, str],
    body: bytes,
) -> tuple[int, Any]:
    """Send the request to every generate node (in the configured order of ``--generate``
    URLs) at once; (status, body) of the combined answer (see the module doc). Nodes that all
    refuse the same way have their refusal passed on."""
    if not upstreams.generate:
        raise UpstreamUnavailable("no generate node is configured")
    # The bodies may differ in length (per-node ranks); httpx counts each.
    sent = {k: v for k, v in headers.items() if k != "content-length"}
    asked = {k: v for k, v in sent.items() if k != "content-type"}

    async def ask(
        node: fleet.Node, method: str, path: str, content: bytes, extra: Any
    ) -> NodeAnswer:
        return await upstreams.ask(
            node, method, path, content, {**(sent if content else asked), **extra}
        )

    path = route.path
    if path in fleet.UPDATE_STEPS:
        return await _update_step(upstreams, ask, path, body)
    # A node that has left the fleet is asked only what it holds (that is how it comes back).
    everyone = path == fleet.WEIGHT_INFO_PATH
    nodes = upstreams.generate if everyone else upstreams.poller.taking_part()
    if not nodes:
        raise UpstreamUnavailable(f"{path}: no generate node is reachable")
    view = upstreams.view()
    query = f"?{params}" if params else ""
    bodies = await _init_bodies(ask, body, nodes, view) if path == fleet.INIT_PATH else None
    asked_at = time.monotonic()
    if route.combine == "first":
        answers = await _until_one_answers(ask, nodes, route.method, path + query)
    else:
        answers = await fleet.ask_each(
            ask, nodes, route.method, path + query, bodies or [body] * len(nodes)
        )
    fleet.learn_pausing(path, nodes, answers)
    if path == fleet.WEIGHT_INFO_PATH:
        upstreams.poller.learn(nodes, answers, asked_at)
        view = upstreams.view()
    refusal = fleet.refused_alike(answers)
    if refusal is not None:
        return refusal.status, refusal.body
    failed = [a for a in answers if not a.ok]
    ok = [a for a in answers if a.ok]
    if route.changes_state:
        _refuse(path, failed, answers, view)
    try:
        if not ok and path != fleet.WEIGHT_INFO_PATH:
            raise UpstreamUnavailable(f"{path}: no generate node answered it")
        return 200, COMBINE[route.combine](answers, nodes, view)
    except CombineError as exc:
        raise _combine_error(exc) from None


async def _update_step(
    upstreams: Upstreams, ask: fleet.Ask, path: str, body: bytes
) -> tuple[int, Any]:
    """One step of a weight update (``tandem_client.fleet``'s protocol), judged on what the
    nodes hold as it begins; the update's id reaches the nodes with its start. This worker
    may not be the one that ran the update's start (nor its earlier chunks): a chunk and a
    finish go to the nodes that tell they take part in it (``fleet.in_update``)."""
    poller = upstreams.poller
    began = time.monotonic()
    await poller.refresh()
    view = poller.view()
    nodes = poller.taking_part()
    if path in (fleet.UPDATE_PATH, fleet.FINISH_PATH):
        nodes = fleet.in_update(nodes, began)
    if not nodes:
        raise UpstreamUnavailable(f"{path}: no generate node is reachable")
    if path == fleet.START_PATH:
        result = await fleet.start_update(ask, nodes, view, poller.seq_mark)
        poller.minted(result.update_id)
    elif path == fleet.UPDATE_PATH:
        result = await fleet.send_chunk(ask, nodes, view, body, {})
    elif path == fleet.FINISH_PATH:
        result = await fleet.finish_update(ask, nodes, view, body, {})
    else:
        result = await fleet.abort_update(ask, nodes, view)
    if path in (fleet.FINISH_PATH, fleet.ABORT_PATH, fleet.UPDATE_PATH):
        await poller.refresh()  # this worker fences at once
    if result.refusal is not None:
        return result.refusal.status, result.refusal.body
    after = upstreams.view()
    _refuse(path, result.failures, result.answers, after, [n.url for n in view.fenced(nodes)])
    if not result.succeeded:
        raise UpstreamUnavailable(f"{path}: no generate node answered it")
    answer = COMBINE["each"](result.answers, result.asked, after)
    if result.update_id is not None:
        answer["update_id"] = str(result.update_id)
    return 200, answer


async def _until_one_answers(
    ask: fleet.Ask, nodes: Sequence[Node], method: str, path: str
) -> list[NodeAnswer]:
    """For a route whose answer is one node's: the nodes asked in order until one answers
    2xx, not the whole fleet at once for answers that would be dropped."""
    answers: list[NodeAnswer] = []
    for node in nodes:
        answers.append(await ask(node, method, path, b"", {}))
        if answers[-1].ok:
            break
    return answers


def _combine_error(exc: CombineError, prefix: str = "") -> FrontError:
    kind = UpstreamError if exc.type == error_types.UPSTREAM_ERROR else ControlPartialFailure
    return kind(prefix + exc.message, details={"failed": exc.failed, "succeeded": exc.succeeded})


def _refuse(
    path: str,
    failed: list[NodeAnswer],
    answers: list[NodeAnswer],
    view: fleet.FleetView,
    fenced_before: list[str] | None = None,
) -> None:
    """A state-changing step that failed on nodes (for an update step: nodes that served when
    it began): each one's own answer, and which nodes are fenced now."""
    if not failed:
        return
    names = ", ".join(a.describe() for a in failed)
    undone = ""
    if path == fleet.START_PATH:
        undone = " (undone on every node that started: none is updating)"
    details: dict[str, Any] = {
        "failed": [a.summary() for a in failed],
        "succeeded": [a.url for a in answers if a.ok],
    }
    if fenced_before is not None:
        details.update(
            weight_version=view.weight_version,
            weights_id=view.weights_id,
            fenced=sorted(u for u, why in view.reasons.items() if why is not None),
            fenced_before=fenced_before,
        )
    raise ControlPartialFailure(
        f"{path} failed on {len(failed)} of {len(answers)} generate nodes: {names}{undone}",
        details=details,
    )
