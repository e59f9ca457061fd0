"""The nodes behind the door: one HTTP client, which node serves a request, node health."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tandem_client.routing import rendezvous_order

from .settings import FrontSettings

__all__ = ["Node", "Upstreams"]


@dataclass
class Node:
    """One upstream node as this worker sees it."""

    tier: str
    url: str
    pending: int = 0
    """Requests this worker has in flight on the node (render spreads by it)."""
    down_until: float = 0.0
    """Until then the node comes last: it refused a connection."""
    healthy_at: float = -1e9
    """When the node last answered /health with 200."""
    checked_at: float = -1e9


class Upstreams:
    """Render and generate nodes plus the HTTP client used for all of them (httpx keeps one
    connection pool per origin)."""

    def __init__(
        self, settings: FrontSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.render = [Node("render", u.rstrip("/")) for u in settings.render_urls]
        self.generate = [Node("generate", u.rstrip("/")) for u in settings.generate_urls]
        # Answers uncompressed unless a caller asks otherwise (its header passes through): the
        # hops inside the fleet are fast, and httpx would otherwise offer every coding it has.
        headers = {"accept-encoding": "identity"}
        if settings.upstream_api_key:
            headers["authorization"] = f"Bearer {settings.upstream_api_key}"
        self.http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=settings.max_connections_per_upstream
                * (len(self.render) + len(self.generate)),
                max_keepalive_connections=settings.max_connections_per_upstream,
            ),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    def render_order(self) -> list[Node]:
        """Render nodes, least pending first (ties broken at random), unreachable ones last."""
        now = time.monotonic()
        nodes = list(self.render)
        random.shuffle(nodes)
        return sorted(nodes, key=lambda n: (n.down_until > now, n.pending))

    def generate_order(self, key: str) -> list[Node]:
        """Generate nodes in ``key``'s rendezvous order (the order tandem_client uses), nodes
        that refused a connection recently last. A node going away moves only its keys."""
        now = time.monotonic()
        by_url = {n.url: n for n in self.generate}
        order = [by_url[u] for u in rendezvous_order(key, list(by_url))]
        return sorted(order, key=lambda n: n.down_until > now)

    def failed(self, node: Node) -> None:
        node.down_until = time.monotonic() + self.settings.node_cooldown_s

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
                node.down_until = 0.0

        await asyncio.gather(*(check(n) for n in nodes))
        return [n for n in nodes if n.healthy_at == n.checked_at]
