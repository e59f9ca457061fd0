"""Control routes: which go to every generate node, and how their answers are combined.

State-changing routes reach EVERY generate node at once; the answer is 200 only when every
node answered 2xx, else ``control_partial_failure`` naming each node that failed. Read-only
routes ask every reachable node and combine the answers as the table says (documented in the
README): a fleet is paused if any node is; world sizes add up; the rest is the first node's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .errors import ControlPartialFailure, UpstreamUnavailable
from .upstreams import Node, Upstreams

__all__ = ["CONTROL_ROUTES", "ControlRoute", "NodeAnswer", "fan_out"]


@dataclass(frozen=True)
class NodeAnswer:
    """What one node said (``status`` 0: it could not be reached)."""

    url: str
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def summary(self) -> dict[str, Any]:
        info = self.body.get("error") if isinstance(self.body, dict) else None
        kind = info.get("type") if isinstance(info, dict) else None
        return {"url": self.url, "status": self.status, "type": kind or "unreachable"}


Combine = Callable[[list[NodeAnswer]], Any]


def _first(answers: list[NodeAnswer]) -> Any:
    return answers[0].body


def _any_paused(answers: list[NodeAnswer]) -> Any:
    return {"is_paused": any(bool(a.body.get("is_paused")) for a in answers)}


def _world_size(answers: list[NodeAnswer]) -> Any:
    return {"world_size": sum(int(a.body.get("world_size", 0)) for a in answers)}


def _each(answers: list[NodeAnswer]) -> Any:
    # Every node's own answer, plus the first one's fields for clients reading one node's shape.
    first = answers[0].body if isinstance(answers[0].body, dict) else {}
    return {**first, "nodes": [{"url": a.url, "body": a.body} for a in answers]}


@dataclass(frozen=True)
class ControlRoute:
    method: str
    changes_state: bool
    combine: Combine


CONTROL_ROUTES: dict[str, ControlRoute] = {
    "/reset_prefix_cache": ControlRoute("POST", True, _each),
    "/pause": ControlRoute("POST", True, _each),
    "/resume": ControlRoute("POST", True, _each),
    "/init_weight_transfer_engine": ControlRoute("POST", True, _each),
    "/start_weight_update": ControlRoute("POST", True, _each),
    "/update_weights": ControlRoute("POST", True, _each),
    "/finish_weight_update": ControlRoute("POST", True, _each),
    "/update_weight_version": ControlRoute("POST", True, _each),
    "/abort_requests": ControlRoute("POST", True, _each),
    "/is_paused": ControlRoute("GET", False, _any_paused),
    "/weight_info": ControlRoute("GET", False, _first),
    "/get_world_size": ControlRoute("GET", False, _world_size),
    "/server_info": ControlRoute("GET", False, _first),
}
"""Every control route of the front door (path -> method, whether it changes engine state,
how node answers become one)."""


async def _ask(
    upstreams: Upstreams,
    node: Node,
    method: str,
    path: str,
    params: str,
    headers: dict[str, str],
    body: bytes,
) -> NodeAnswer:
    url = f"{node.url}{path}" + (f"?{params}" if params else "")
    try:
        r = await upstreams.http.request(method, url, headers=headers, content=body or None)
    except httpx.HTTPError:
        upstreams.failed(node)
        return NodeAnswer(node.url, 0, None)
    try:
        parsed: Any = r.json()
    except (ValueError, json.JSONDecodeError):
        parsed = r.text[:200]
    return NodeAnswer(node.url, r.status_code, parsed)


async def fan_out(
    upstreams: Upstreams,
    route: ControlRoute,
    path: str,
    params: str,
    headers: dict[str, str],
    body: bytes,
    nodes: Sequence[Node],
) -> tuple[int, Any]:
    """Send the request to ``nodes`` at once; (status, body) of the combined answer (see the
    module doc). Nodes that all refuse the same way have their refusal passed on."""
    if not nodes:
        raise UpstreamUnavailable("no generate node is configured")
    answers = list(
        await asyncio.gather(
            *(_ask(upstreams, n, route.method, path, params, headers, body) for n in nodes)
        )
    )
    failed = [a for a in answers if not a.ok]
    ok = [a for a in answers if a.ok]
    if failed and not ok and len({a.status for a in failed}) == 1 and failed[0].status:
        # Every node refused the same way (bad body, no such route, no key): their answer.
        return failed[0].status, failed[0].body
    if route.changes_state and failed:
        names = ", ".join(f"{a.url} ({a.status or 'unreachable'})" for a in failed)
        raise ControlPartialFailure(
            f"{path} failed on {len(failed)} of {len(answers)} generate nodes: {names}",
            details={
                "failed": [a.summary() for a in failed],
                "succeeded": [a.url for a in ok],
            },
        )
    if not ok:
        raise UpstreamUnavailable(f"{path}: no generate node answered it")
    return 200, route.combine(ok)
