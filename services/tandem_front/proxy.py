"""Pass-through: a request goes to the first reachable node of an order, its answer streams
back unchanged (status, headers, bytes: typed errors, 409 and 429 with Retry-After alike).

How the door fails as a proxy (each a typed error, never a 500): no node reachable -> 503
``upstream_unavailable``; a node that took the request but does not answer in time -> 504
``upstream_timeout``; a connection reset or protocol error -> 502 ``upstream_error``. After the
first byte of an event stream, the failure is one error event then ``data: [DONE]`` (as vLLM
ends a failed stream), and of a binary stream (``tandem_wire.streams``) its ``ERROR`` frame;
other answers are cut off. Every upstream answer is closed, and its node's
pending count given back, however the request ends, the caller hanging up included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem_http import (
    DRAINING_HEADER,
    TENANT_HEADER,
    Slot,
    error_body,
    principal_of,
    request_id_of,
)
from tandem_wire import (
    ErrorBody,
    ErrorInfo,
    PayloadTooLarge,
    TandemHTTPError,
    WireFormat,
    error_types,
)
from tandem_wire.protocol import STREAM_FRAME_HEADER_BYTES, StreamFrameKind
from tandem_wire.streams import encode_error_frame, is_stream_frames

from .errors import DoorBusy, FrontError, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from .metrics import FrontMetrics
from .upstreams import Node, Upstreams

__all__ = [
    "DONE",
    "ClientGone",
    "Forwarder",
    "HandedOver",
    "OnceStream",
    "Relay",
    "downstream_headers",
    "error_event",
    "error_frame",
    "frames_with_error_tail",
    "merged",
    "sse_with_error_tail",
    "tenant_header",
    "unless_gone",
    "upstream_failure",
    "upstream_headers",
    "with_upstream_headers",
]

T = TypeVar("T")

log = logging.getLogger("tandem")

DONE = b"data: [DONE]\n\n"

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
_NOT_UPSTREAM = _HOP_BY_HOP | {"authorization", "content-length", TENANT_HEADER}
_NOT_DOWNSTREAM = _HOP_BY_HOP | {"date", "server"}


def upstream_headers(request: Request, content_length: int | None = None) -> dict[str, str]:
    """The caller's end-to-end headers (the caller's key is not the upstream's: dropped), and
    who the caller is (``tenant_header``)."""
    headers = {k: v for k, v in request.headers.items() if k not in _NOT_UPSTREAM}
    headers.update(tenant_header(request))
    declared = request.headers.get("content-length")
    if content_length is not None:
        headers["content-length"] = str(content_length)
    elif declared is not None:
        headers["content-length"] = declared
    return headers


def tenant_header(request: Request) -> dict[str, str]:
    """``TENANT_HEADER`` naming the door's caller (the digest of its key), for the nodes that
    trust this door with it; none for a caller let in without a key (a caller's own is never
    passed on)."""
    principal = principal_of(request)
    return {TENANT_HEADER: principal} if principal else {}


def downstream_headers(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [
        (k.lower(), v)
        for k, v in response.headers.raw
        if k.decode("latin-1").lower() not in _NOT_DOWNSTREAM
    ]


_REWRITTEN = (b"content-length", b"content-encoding", b"content-type")


def with_upstream_headers(answer: Response, upstream: httpx.Response) -> Response:
    """``answer`` (a body the door re-sends: read whole, so decoded, maybe reshaped) with the
    upstream's end-to-end headers (``Retry-After``, ``x-request-id``...); the body's own
    length, coding and type stay the answer's."""
    kept = [(k, v) for k, v in downstream_headers(upstream) if k not in _REWRITTEN]
    answer.raw_headers = [*kept, *answer.raw_headers]
    return answer


def upstream_failure(exc: BaseException, node: Node) -> FrontError:
    """The typed error for a transport failure talking to ``node`` (connect failures are
    ``open``'s business: they may move the request to the next node)."""
    name = type(exc).__name__
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return UpstreamUnavailable(f"{node.tier} node {node.url} could not be reached ({name})")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"{node.tier} node {node.url} did not answer in time ({name})")
    return UpstreamError(f"{node.tier} node {node.url}: the connection failed ({name})")


def _typed(exc: BaseException, request_id: str) -> tuple[int, str, str]:
    """``exc`` as an answer's error: status, type and message (``internal_error`` if a bug)."""
    if isinstance(exc, TandemHTTPError):
        return exc.status_code, exc.type, exc.message
    return 500, error_types.INTERNAL_ERROR, f"internal error (request id {request_id})"


def error_event(exc: BaseException, request_id: str) -> bytes:
    """One SSE event carrying ``exc`` as a typed error (``internal_error`` if it is a bug)."""
    status, type_, message = _typed(exc, request_id)
    body = error_body(
        WireFormat.JSON, status_code=status, type=type_, message=message, request_id=request_id
    )
    return b"data: " + body + b"\n\n"


def error_frame(exc: BaseException, request_id: str) -> bytes:
    """The binary stream's ``ERROR`` frame carrying ``exc`` as ``error_event`` carries it."""
    status, type_, message = _typed(exc, request_id)
    info = ErrorInfo(type=type_, message=message, code=status, request_id=request_id)
    return encode_error_frame(ErrorBody(info))


async def frames_with_error_tail(
    source: AsyncIterator[bytes], request_id: str
) -> AsyncIterator[bytes]:
    """A binary stream's bytes re-cut at frame boundaries (nothing decoded: a proxy passes
    them on); if ``source`` fails before the stream's last frame, an ``ERROR`` frame carrying
    the failure ends it, as an error event ends a failed SSE stream."""
    held = b""
    ended = False
    try:
        async for chunk in source:
            held += chunk
            cut, ended = _whole_frames(held, ended)
            if cut:
                yield held[:cut]
                held = held[cut:]
        if held:
            yield held
    except Exception as exc:
        if not ended:
            yield error_frame(exc, request_id)
    finally:
        await _aclose(source)


def _whole_frames(held: bytes, ended: bool) -> tuple[int, bool]:
    """Where the whole frames at the start of ``held`` end, and whether the stream's last
    frame is among them (or was before)."""
    at = 0
    while not ended and len(held) - at >= STREAM_FRAME_HEADER_BYTES:
        size = int.from_bytes(held[at + 1 : at + STREAM_FRAME_HEADER_BYTES], "big")
        end = at + STREAM_FRAME_HEADER_BYTES + size
        if end > len(held):
            break
        ended = held[at] != StreamFrameKind.EVENT
        at = end
    return (len(held) if ended else at), ended


async def sse_with_error_tail(
    source: AsyncIterator[bytes], request_id: str
) -> AsyncIterator[bytes]:
    """``source``'s events; if it fails, one error event then ``[DONE]`` (vLLM's way to end a
    stream whose status line is long gone), so a client never reads a cut-off stream as whole."""
    try:
        async for chunk in source:
            yield chunk
    except Exception as exc:
        yield error_event(exc, request_id)
        yield DONE
    finally:
        await _aclose(source)


async def _aclose(iterator: Any) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


class Relay(StreamingResponse):
    """A streamed answer whose upstream answers are released however it ends: sent whole, cut
    by an upstream failure, or left by its client (a BackgroundTask runs only in the first
    case: an upstream dying mid-answer would hold its node's pending count up for good)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[], Awaitable[None]],
        status_code: int = 200,
        media_type: str | None = None,
    ) -> None:
        super().__init__(content, status_code, media_type=media_type)
        self._release = release

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except FrontError as exc:
            # Past the status line, an upstream failure can only cut the answer short: its end
            # is never sent, so the server drops the connection and the caller never takes
            # a part for the whole (event streams end with an error event instead).
            log.warning("answer cut short: %s", exc.message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await _aclose(self.body_iterator)
                finally:
                    await self._release()


class ClientGone(Exception):
    """The caller hung up before its answer was ready; the work for it was cancelled."""


async def _disconnected(request: Request, body: OnceStream | None) -> None:
    if body is not None:
        await body.finished.wait()
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T], body: OnceStream | None = None) -> T:
    """``work``'s result, unless the caller hangs up first: then ``work`` is cancelled (which
    closes its upstream connection, and a node aborts a request whose connection closed) and
    ``ClientGone`` raised. Listens only once the body is read (all of it, or all of ``body``
    when it is streamed on): until then ``receive`` is the body's."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request, body))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task, watcher})
    if task.cancelled():
        raise ClientGone("the caller hung up")
    return task.result()


async def merged(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The items of every source as each comes (a slow source does not hold up the others);
    the first failure ends the merge. Sources are closed however the merge ends."""
    if len(sources) == 1:
        try:
            async for item in sources[0]:
                yield item
        finally:
            await _aclose(sources[0])
        return
    end = object()
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=len(sources))

    async def pump(source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(end)
        except Exception as exc:
            await queue.put(exc)
        finally:
            await _aclose(source)

    tasks = [asyncio.ensure_future(pump(s)) for s in sources]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is end:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class OnceStream:
    """A request body stream that knows whether anyone started reading it (a connection that
    failed before the first read may be retried on another node with the same stream) and
    when it was read to its end (from then on, the caller can be listened to)."""

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source
        self.started = False
        self.finished = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        async for chunk in self._source:
            yield chunk
        self.finished.set()


class Forwarder:
    """Sends one request to the first node of an order that can be reached."""

    def __init__(self, upstreams: Upstreams, metrics: FrontMetrics) -> None:
        self.upstreams = upstreams
        self.metrics = metrics
        # Answers opened and not yet closed: each holds one pending count on its node.
        self._held: set[httpx.Response] = set()

    async def open(
        self,
        nodes: Sequence[Node],
        method: str,
        path: str,
        headers: dict[str, str],
        content: bytes | OnceStream | HandedOver | None,
        params: str = "",
    ) -> tuple[Node, httpx.Response]:
        """The first node that took the request, with its answer (body not read yet; give it
        back with ``close`` or ``read``).

        Only failures that prove the request was not run move it to the next one (connection
        refused or timed out, or a draining node's 503 for a body held in memory); anything
        later is the node's answer, or a typed error (``upstream_failure``).
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
            except httpx.PoolTimeout:
                # The door's own pool was full for the whole wait: the request never left,
                # and the node is not at fault (no cool-down, still reachable).
                node.pending -= 1
                self.metrics.upstream_errors.labels(tier, node.url, "pool_full").inc()
                raise DoorBusy(
                    f"the door's connections to the {tier} nodes are all in use; try again"
                ) from None
            except httpx.HTTPError as exc:
                node.pending -= 1
                raise self.failure(exc, node) from None
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
            self._held.add(response)
            self.metrics.upstream_latency.labels(tier, node.url).observe(
                time.perf_counter() - start
            )
            if response.status_code >= 400:
                self.metrics.upstream_errors.labels(tier, node.url, str(response.status_code)).inc()
            return node, response
        raise UpstreamUnavailable(f"no {tier} node is configured")

    def failure(self, exc: BaseException, node: Node) -> FrontError:
        """``upstream_failure``, counted in the metrics. A node that did not answer in time
        (hung, or paused with nobody to resume it) comes last for a while, as one that
        refused the connection: its next requests go to the others first."""
        if isinstance(exc, httpx.TimeoutException):
            self.upstreams.failed(node)
        error = upstream_failure(exc, node)
        self.metrics.upstream_errors.labels(node.tier, node.url, error.type).inc()
        return error

    async def close(self, node: Node, response: httpx.Response) -> None:
        """Give back an answer ``open`` returned (once; later calls do nothing). Closing an
        answer not read to its end drops its connection, which cancels the upstream request."""
        if response in self._held:
            self._held.discard(response)
            node.pending -= 1
        await response.aclose()

    async def read(
        self,
        node: Node,
        response: httpx.Response,
        max_bytes: int | None = None,
        slot: Slot | None = None,
    ) -> bytes:
        """The whole answer (decoded from its content coding), given back however it ends.
        With ``max_bytes``, an answer past it is refused (413) as it arrives, never held;
        the request's admission ``slot`` is charged its bytes before they are held (its
        Content-Length first, then what arrives past that), and the copy they are joined into
        while both exist (refused 429/413 as the rest)."""
        try:
            if max_bytes is None and slot is None:
                return await response.aread()
            return await _read_capped(response, max_bytes, slot)
        except httpx.HTTPError as exc:
            raise self.failure(exc, node) from None
        finally:
            await self.close(node, response)

    async def forward(
        self,
        nodes: Sequence[Node],
        request: Request,
        path: str,
        content: bytes | OnceStream | None,
    ) -> Response:
        """Pass ``request`` through; the answer streams back as it comes. A caller hanging up
        closes the upstream connection, which cancels the upstream request: while the answer
        streams, and before it starts (a non-streamed generate answer comes whole at its end)."""
        length = len(content) if isinstance(content, bytes) else None
        headers = upstream_headers(request, length)
        node, response = await unless_gone(
            request,
            self.open(nodes, request.method, path, headers, content, request.url.query),
            content if isinstance(content, OnceStream) else None,
        )
        raw = self._relay(node, response)
        ctype = response.headers.get("content-type", "")
        if "content-encoding" not in response.headers:
            if ctype.startswith("text/event-stream"):
                raw = sse_with_error_tail(_whole_events(raw), request_id_of(request))
            elif is_stream_frames(ctype):
                raw = frames_with_error_tail(raw, request_id_of(request))
        answer = Relay(raw, lambda: self.close(node, response), response.status_code)
        answer.raw_headers = downstream_headers(response)
        return answer

    async def _relay(self, node: Node, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise self.failure(exc, node) from None
        finally:
            await self.close(node, response)


async def _read_capped(response: httpx.Response, max_bytes: int | None, slot: Slot | None) -> bytes:
    declared = response.headers.get("content-length", "")
    charged = int(declared) if declared.isdigit() else 0
    too_large = PayloadTooLarge(f"{response.request.url.path} answered more than {max_bytes} bytes")
    if max_bytes is not None and charged > max_bytes:
        raise too_large
    if slot is not None and charged:
        slot.take(charged)
    parts, total = [], 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise too_large
        if slot is not None and total > charged:
            slot.take(total - charged)
            charged = total
        parts.append(chunk)
    if len(parts) == 1:
        return parts[0]  # nothing to join
    if slot is not None:
        slot.take(total)  # the joined copy, while the pieces are still held
    try:
        return b"".join(parts)
    finally:
        parts.clear()
        if slot is not None:
            slot.give_back(total)


_SLICE = 256 * 1024


class HandedOver(httpx.AsyncByteStream):
    """A request body, as pieces sent one after the other, held until ``drop``: sent again on
    a retry to another node, and let go once a node has taken it (an answer that streams for
    minutes keeps its request object, and would keep its body with it)."""

    def __init__(self, body: bytes | list[bytes | memoryview]) -> None:
        self.pieces: list[bytes | memoryview] | None = [body] if isinstance(body, bytes) else body
        self.length = sum(memoryview(p).nbytes for p in self.pieces)
        self.copied = sum(len(p) for p in self.pieces if isinstance(p, bytes))
        """Bytes held in pieces of its own (the others are views into a body held anyway)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.pieces is None:
            raise RuntimeError("a dropped body was sent again")
        for piece in self.pieces:
            if isinstance(piece, bytes):
                yield piece
                continue
            # h11 copies what it writes into bytes: a view goes in slices, each copied into
            # memory the allocator reuses, rather than into one fresh buffer of its size.
            for at in range(0, piece.nbytes, _SLICE):
                yield bytes(piece[at : at + _SLICE])

    def drop(self) -> None:
        self.pieces = None


async def _whole_events(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An event stream re-cut at event boundaries: an error event after a failure then never
    lands in the middle of a half-sent event."""
    held = b""
    try:
        async for chunk in source:
            seen = len(held)
            held += chunk
            cut = held.rfind(b"\n\n", max(0, seen - 1)) + 2  # only the new bytes are scanned
            if cut >= 2:
                yield held[:cut]
                held = held[cut:]
        if held:
            yield held
    finally:
        await _aclose(source)
