"""Pass-through: a request goes to the first reachable node of an order, its answer streams
back unchanged (status, headers, bytes: typed errors, 409 and 429 with Retry-After alike)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from tandem_http import DRAINING_HEADER

from .errors import UpstreamUnavailable
from .metrics import FrontMetrics
from .upstreams import Node, Upstreams

__all__ = ["Forwarder", "OnceStream", "upstream_headers", "downstream_headers"]

# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the front door sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
_NOT_UPSTREAM = _HOP_BY_HOP | {"authorization", "content-length"}
_NOT_DOWNSTREAM = _HOP_BY_HOP | {"date", "server"}


def upstream_headers(request: Request, content_length: int | None = None) -> dict[str, str]:
    """The caller's end-to-end headers (the caller's key is not the upstream's: dropped)."""
    headers = {k: v for k, v in request.headers.items() if k not in _NOT_UPSTREAM}
    declared = request.headers.get("content-length")
    if content_length is not None:
        headers["content-length"] = str(content_length)
    elif declared is not None:
        headers["content-length"] = declared
    return headers


def downstream_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (k.lower(), v)
        for k, v in response.headers.raw
        if k.decode("latin-1").lower() not in _NOT_DOWNSTREAM
    ]


class OnceStream:
    """A request body stream that knows whether anyone started reading it: a connection that
    failed before the first read may be retried on another node with the same stream."""

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self._source:
            yield chunk


class Forwarder:
    """Sends one request to the first node of an order that can be reached."""

    def __init__(self, upstreams: Upstreams, metrics: FrontMetrics) -> None:
        self.upstreams = upstreams
        self.metrics = metrics

    async def open(
        self,
        nodes: Sequence[Node],
        method: str,
        path: str,
        headers: dict[str, str],
        content: bytes | OnceStream | None,
        params: str = "",
    ) -> tuple[Node, httpx.Response]:
        """The first node that took the request, with its answer (body not read yet).

        Only failures that prove the request was not run move it to the next one (connection
        refused or timed out, or a draining node's 503 for a body held in memory); anything
        later is the node's answer.
        """
        tier = nodes[0].tier if nodes else "upstream"
        for i, node in enumerate(nodes):
            url = f"{node.url}{path}" + (f"?{params}" if params else "")
            req = self.upstreams.http.build_request(method, url, headers=headers, content=content)
            start = time.perf_counter()
            node.pending += 1
            try:
                response = await self.upstreams.http.send(req, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                node.pending -= 1
                self.upstreams.failed(node)
                self.metrics.upstream_errors.labels(tier, node.url, "connect").inc()
                replayable = not isinstance(content, OnceStream) or not content.started
                if i + 1 < len(nodes) and replayable:
                    self.metrics.upstream_retries.labels(tier).inc()
                    continue
                raise UpstreamUnavailable(
                    f"no {tier} node could be reached (last: {node.url}: {type(exc).__name__})"
                ) from None
            except BaseException:
                node.pending -= 1
                raise
            if (
                response.status_code == 503
                and DRAINING_HEADER in response.headers
                and i + 1 < len(nodes)
                and not isinstance(content, OnceStream)
            ):
                # The node is shutting down and did not run the request: the next one may.
                node.pending -= 1
                await response.aclose()
                self.upstreams.failed(node)
                self.metrics.upstream_errors.labels(tier, node.url, "draining").inc()
                self.metrics.upstream_retries.labels(tier).inc()
                continue
            self.metrics.upstream_latency.labels(tier, node.url).observe(
                time.perf_counter() - start
            )
            if response.status_code >= 400:
                self.metrics.upstream_errors.labels(tier, node.url, str(response.status_code)).inc()
            return node, response
        raise UpstreamUnavailable(f"no {tier} node is configured")

    async def close(self, node: Node, response: httpx.Response) -> None:
        node.pending -= 1
        await response.aclose()

    async def forward(
        self,
        nodes: Sequence[Node],
        request: Request,
        path: str,
        content: bytes | OnceStream | None,
    ) -> StreamingResponse:
        """Pass ``request`` through; the answer streams back as it comes. A caller hanging up
        closes the upstream connection, which cancels the upstream request."""
        length = len(content) if isinstance(content, bytes) else None
        headers = upstream_headers(request, length)
        node, response = await self.open(
            nodes, request.method, path, headers, content, request.url.query
        )
        answer = StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            background=BackgroundTask(self.close, node, response),
        )
        answer.raw_headers = downstream_headers(response)
        return answer
