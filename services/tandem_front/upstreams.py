"""The nodes behind the door: one HTTP client, which node serves a request, node health and
weight versions (the rules are ``tandem_client.fleet``'s)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tandem_client import fleet
from tandem_client.discovery import DNS_PREFIX
from tandem_client.fleet import NodeAnswer
from tandem_client.poller import FleetPoller
from tandem_client.unix_nodes import UNIX_PREFIX, node_client
from tandem_http import MAX_BODY_HEADER
from tandem_wire.error_types import OVERLOADED

from .metrics import FrontMetrics
from .settings import FrontSettings

__all__ = ["Node", "Upstreams"]

log = logging.getLogger("tandem.front.upstreams")


@dataclass
class Node(fleet.Node):
    """One upstream node as this worker sees it."""

    tier: str = "generate"
    healthy_at: float = -1e9
    """When the node last answered /health with 200."""
    checked_at: float = -1e9
    max_body_bytes: int | None = None
    """The largest body the node last said it takes (``x-tandem-max-body-bytes``)."""


class Upstreams:
    """Render and generate nodes plus the HTTP client used for all of them (httpx keeps one
    connection pool per origin)."""

    def __init__(
        self,
        settings: FrontSettings,
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: FrontMetrics | None = None,
        mounts: dict[str, httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        """Where a node's series are dropped when it leaves (``set_nodes``)."""
        # Names to resolve (dns+http://) join at the first discovery (see ``discovery``).
        self.render = [Node(u, tier="render") for u in _fixed(settings.render_urls)]
        self.generate = [Node(u, tier="generate") for u in _fixed(settings.generate_urls)]
        discovered = len(self.render) + len(self.generate) < len(settings.render_urls) + len(
            settings.generate_urls
        )
        # Answers uncompressed unless a caller asks otherwise (its header passes through): the
        # hops inside the fleet are fast, and httpx would otherwise offer every coding it has.
        headers = {"accept-encoding": "identity"}
        if settings.upstream_api_key:
            headers["authorization"] = f"Bearer {settings.upstream_api_key}"
        per_node = httpx.Limits(
            max_connections=settings.max_connections_per_upstream,
            max_keepalive_connections=settings.max_connections_per_upstream,
            # Shorter than the nodes keep theirs (checked by FrontSettings): the door drops
            # an idle connection before the node does, never the other way round.
            keepalive_expiry=settings.upstream_keepalive_s,
        )
        fixed = [n.url for n in (*self.render, *self.generate)]
        self.http = node_client(
            fixed,
            per_node,
            headers=headers,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(
                # With discovered nodes their number is not known: the admission gate
                # (max_pending) bounds the requests in flight instead.
                max_connections=None
                if discovered
                else settings.max_connections_per_upstream * len(fixed),
                max_keepalive_connections=per_node.max_keepalive_connections,
                keepalive_expiry=per_node.keepalive_expiry,
            ),
            transport=transport,
            mounts=mounts,  # an in-process render (``inline_render``)
            event_hooks={"response": [self._learn]},
        )
        self._by_origin = {_origin(n.url): n for n in (*self.render, *self.generate)}
        self.poller: FleetPoller[Node] = FleetPoller(
            self.ask, lambda: self.generate, settings.node_timeout_s, settings.fence_poll_s
        )
        """What this worker knows of the generate nodes' weights (shared with
        ``tandem_client``'s)."""

    async def start(self) -> None:
        """Ask the generate nodes their weights, and serve nothing before each answered once
        or timed out (``--control-timeout-s``); then ask again every ``fence_poll_s``."""
        await self.poller.start()

    async def aclose(self) -> None:
        await self.poller.aclose()
        await self.http.aclose()

    def set_nodes(self, tier: str, urls: Sequence[str]) -> list[Node]:
        """The node set of ``tier`` is now ``urls``: nodes that stay keep their state (load,
        cool-down, body cap); the new ones are returned."""
        old = {n.url: n for n in (self.render if tier == "render" else self.generate)}
        nodes = [old.get(u) or Node(u, tier=tier) for u in urls]
        if self.metrics is not None:
            for gone in set(old) - set(urls):
                self.metrics.forget(tier, gone)
        if tier == "render":
            self.render = nodes
        else:
            self.generate = nodes
        self._by_origin = {_origin(n.url): n for n in (*self.render, *self.generate)}
        return [n for n in nodes if n.url not in old]

    def view(self) -> fleet.FleetView:
        """The generate fleet as judged now (``tandem_client.fleet.judge``)."""
        return self.poller.view()

    def render_order(self) -> list[Node]:
        """Render nodes, least pending first (ties broken at random), unreachable ones last."""
        return fleet.least_pending(self.render, time.monotonic())

    def generate_order(self, key: str) -> list[Node]:
        """The generate nodes that may serve (``tandem_client.fleet.judge``) in ``key``'s
        rendezvous order (as tandem_client's), those that refused a connection recently last.
        A node joining or going away moves only its keys."""
        return fleet.rendezvous_nodes(key, self.generate, self.view(), time.monotonic())

    async def ask(
        self,
        node: fleet.Node,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> NodeAnswer:
        """One control call to one node (``path`` with its query); status 0: unreachable.
        Only the calls that load weights may take the long read timeout."""
        s = self.settings
        wait = (
            s.read_timeout_s if path.split("?")[0] in fleet.LOADING_PATHS else s.control_timeout_s
        )
        timeout = httpx.Timeout(wait, connect=s.connect_timeout_s)
        try:
            r = await self.http.request(
                method, f"{node.url}{path}", headers=headers, content=body or None, timeout=timeout
            )
        except httpx.PoolTimeout:
            # The door's own connections were all in use: the node was not asked, so it
            # neither cools down nor counts as unreachable (the step still failed on it).
            why = "not asked: the door's connections to it were all in use"
            return NodeAnswer(node.url, 0, {"error": {"type": OVERLOADED, "message": why}})
        except httpx.HTTPError as exc:
            node.cool_down(time.monotonic(), s.node_cooldown_s)
            return NodeAnswer(node.url, 0, f"{type(exc).__name__}: {exc}")
        node.reached()
        try:
            parsed: Any = r.json()
        except (ValueError, json.JSONDecodeError):
            parsed = r.text[:200]
        return NodeAnswer(node.url, r.status_code, parsed)

    async def _learn(self, response: httpx.Response) -> None:
        """Any answer from a node may tell its body cap (generate's /health does)."""
        told = response.headers.get(MAX_BODY_HEADER, "")
        node = self._node_of(response.request.url)
        if node is not None and told.isdigit():
            node.max_body_bytes = int(told)

    def _node_of(self, url: httpx.URL) -> Node | None:
        """The node a request went to: by its origin, or a unix: node by the socket path its
        URL starts with (such URLs have no host to tell them apart)."""
        if url.scheme != "unix":
            return self._by_origin.get((url.scheme, url.host, url.port))
        text = f"{url}/"
        return next((n for n in self._by_origin.values() if text.startswith(f"{n.url}/")), None)

    async def generate_body_cap(self, declared: int) -> int:
        """The largest generate body taken: the largest cap a generate node told (asking
        their /health first when none has yet and ``declared`` is over the default), or
        ``max_body_bytes`` when the operator set it or no node tells."""
        s = self.settings
        if not s.follow_generate_body_cap:
            return s.max_body_bytes
        if declared > s.max_body_bytes and not any(n.max_body_bytes for n in self.generate):
            await self.healthy(self.generate)
        return max((n.max_body_bytes or 0 for n in self.generate), default=0) or s.max_body_bytes

    def failed(self, node: Node) -> None:
        node.cool_down(time.monotonic(), self.settings.node_cooldown_s)

    async def healthy(self, nodes: Sequence[Node]) -> list[Node]:
        """The nodes answering /health with 200 (answers reused for ``health_interval_s``)."""

        async def check(node: Node) -> None:
            now = time.monotonic()
            if now - node.checked_at < self.settings.health_interval_s:
                return
            try:
                r = await self.http.get(f"{node.url}/health", timeout=2.0)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            node.checked_at = time.monotonic()
            if ok:
                node.healthy_at = node.checked_at
                node.healthy()

        await asyncio.gather(*(check(n) for n in nodes))
        return [n for n in nodes if n.healthy_at == n.checked_at]


def _fixed(specs: Sequence[str]) -> list[str]:
    return [u.rstrip("/") for u in specs if not u.startswith(DNS_PREFIX)]


def _origin(url: str) -> tuple[str, str, int | None]:
    if url.startswith(UNIX_PREFIX):
        return "unix", url, None  # the URL itself: every socket's origin has the same host
    u = httpx.URL(url)
    return u.scheme, u.host, u.port
