"""In-process HTTP clients for ASGI apps, with the app's lifespan run around them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx


@asynccontextmanager
async def app_client(
    app, base_url: str = "http://app", *, raise_app_exceptions: bool = True, **kwargs
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app in-process; ``raise_app_exceptions=False`` shows a 500 as a server
    would (Starlette re-raises after answering it)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url=base_url, **kwargs) as c:
            yield c


class HostRouter(httpx.AsyncBaseTransport):
    """Sends each request to the in-process app named by its host (``http://render/...``)."""

    def __init__(self, apps: dict[str, object]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)


class AsgiCall:
    """One HTTP request driven by hand against an ASGI app, with no transport in between:
    the answer's chunks as the app sends them, and a client that can hang up mid-answer.
    (httpx's ASGITransport collects a whole answer before returning, so it cannot show a
    stream in progress.)"""

    def __init__(
        self, app, method: str, path: str, body: bytes = b"", headers: dict | None = None
    ) -> None:
        self._body = body
        self._body_sent = False
        self._gone = asyncio.Event()
        self.messages: asyncio.Queue = asyncio.Queue()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000),
            "server": ("app", 80),
            "state": {},
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        await self.messages.put(message)

    async def status(self) -> int:
        start = await asyncio.wait_for(self.messages.get(), 60)
        return int(start["status"])

    async def chunk(self) -> bytes:
        """The next non-empty body chunk."""
        while True:
            message = await asyncio.wait_for(self.messages.get(), 60)
            if message.get("body"):
                return bytes(message["body"])

    async def hang_up(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 60)


class BodyCall:
    """One request driven by hand: its body is handed over in ``chunks`` as the app asks
    (``gap_s`` apart), and the chunks the app asked for are counted (a refused body is never
    asked for). Content-Length is their sum (``declared`` overrides it; ``declare=False``: none);
    ``ends=False``: the last chunk says more follows, and none does (a stalled client). After
    the body, the client stays until ``gone`` is set."""

    def __init__(
        self,
        app,
        path: str,
        chunks: list[bytes],
        *,
        declare: bool = True,
        declared: int | None = None,
        gap_s: float = 0.0,
        ends: bool = True,
    ) -> None:
        self.chunks = list(chunks)
        self.gap_s = gap_s
        self.ends = ends
        self.asked = 0
        self.gone = asyncio.Event()
        self.messages: list[dict] = []
        headers = [(b"content-type", b"application/json")]
        if declare:
            length = sum(map(len, chunks)) if declared is None else declared
            headers.append((b"content-length", str(length).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("app", 80),
            "state": {},
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if self.asked < len(self.chunks):
            if self.asked and self.gap_s:
                await asyncio.sleep(self.gap_s)
            self.asked += 1
            more = not self.ends or self.asked < len(self.chunks)
            return {"type": "http.request", "body": self.chunks[self.asked - 1], "more_body": more}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        self.messages.append(message)

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        with contextlib.suppress(RuntimeError):  # Starlette re-raises after answering 500
            await asyncio.wait_for(self.task, 60)
        start = self.messages[0]
        headers = {k.decode(): v.decode() for k, v in start["headers"]}
        return start["status"], headers, b"".join(m.get("body", b"") for m in self.messages[1:])


async def until(condition) -> None:
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never met")
