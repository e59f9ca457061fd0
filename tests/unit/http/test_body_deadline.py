"""Request bodies on a deadline: a body that stalls or trickles is refused with 408
``body_timeout`` and gives its admission slot back, so slow clients cannot hold a process."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_http import (
    AdmissionGate,
    BodyDeadline,
    BodyDeadlineMiddleware,
    admitted,
    install_error_handlers,
    read_body,
)

pytestmark = pytest.mark.anyio

LIMIT = 4  # max_pending: the slow clients below take every slot


def deadline_app(deadline: BodyDeadline | None) -> tuple[FastAPI, AdmissionGate]:
    gate = AdmissionGate(LIMIT, "tandem_deadline", CollectorRegistry(), max_bytes=1 << 20)
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(BodyDeadlineMiddleware, deadline=deadline)

    @app.post("/work")
    @admitted(gate)
    async def work(request: Request) -> Response:
        return JSONResponse({"length": len(await read_body(request, 1 << 20))})

    return app, gate


class SlowCall:
    """One request whose body comes as the test says: ``chunks`` handed over one by one,
    ``gap_s`` apart, then nothing more (the client stalls with its body unfinished unless the
    last chunk ends it)."""

    def __init__(
        self,
        app,
        chunks: list[bytes],
        *,
        declared: int,
        gap_s: float = 0.0,
        ends: bool = False,
        path: str = "/work",
    ) -> None:
        self.chunks = list(chunks)
        self.gap_s = gap_s
        self.ends = ends
        self.asked = 0
        self.messages: list[dict] = []
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
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(declared).encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("app", 80),
            "state": {},
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if self.asked < len(self.chunks):
            if self.asked:
                await asyncio.sleep(self.gap_s)
            self.asked += 1
            more = not self.ends or self.asked < len(self.chunks)
            return {"type": "http.request", "body": self.chunks[self.asked - 1], "more_body": more}
        await asyncio.Event().wait()  # a client that never sends the rest
        raise AssertionError("unreachable")

    async def _send(self, message: dict) -> None:
        self.messages.append(message)

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        with contextlib.suppress(RuntimeError):
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


async def test_stalled_bodies_holding_every_slot_are_let_go_and_a_normal_request_is_served():
    app, gate = deadline_app(BodyDeadline(timeout_s=0.3, min_rate=1 << 20))
    stalled = [SlowCall(app, [b"{"], declared=4096) for _ in range(LIMIT)]
    await until(lambda: gate.current == LIMIT)
    refused = SlowCall(app, [b"{}"], declared=2, ends=True)
    assert (await refused.answer())[0] == 429  # every slot is held by a stalled body
    for call in stalled:
        status, headers, body = await call.answer()
        assert status == 408
        assert b'"body_timeout"' in body
        assert headers["connection"] == "close"
    assert gate.current == 0 and gate.held == 0
    normal = SlowCall(app, [b"{}"], declared=2, ends=True)
    assert (await normal.answer())[:1] == (200,)


async def test_a_body_that_trickles_below_the_minimum_rate_is_refused_though_it_never_pauses():
    # Pieces 20 ms apart (never a pause of the 0.2 s timeout), at 50 bytes/s against 1000.
    app, gate = deadline_app(BodyDeadline(timeout_s=0.2, min_rate=1000))
    call = SlowCall(app, [b" "] * 1000, declared=1000, gap_s=0.02)
    status, _, body = await call.answer()
    assert status == 408
    assert b'"body_timeout"' in body
    assert 1 < call.asked < 1000
    assert gate.current == 0 and gate.held == 0


async def test_a_body_at_the_rate_is_read_whole_and_the_wait_after_it_is_not_timed():
    app, gate = deadline_app(BodyDeadline(timeout_s=0.2, min_rate=1000))

    @app.post("/then-wait")
    async def then_wait(request: Request) -> Response:
        body = await read_body(request, 1 << 20)
        await asyncio.sleep(0.4)  # past the timeout, after the body: listening is untimed
        assert not await request.is_disconnected()
        return JSONResponse({"length": len(body)})

    for path in ("/work", "/then-wait"):
        call = SlowCall(app, [b"x" * 100] * 5, declared=500, gap_s=0.01, ends=True, path=path)
        status, _, body = await call.answer()
        assert (status, body) == (200, b'{"length":500}')
    assert gate.current == 0


async def test_without_a_deadline_a_stalled_body_is_waited_for():
    app, gate = deadline_app(None)
    call = SlowCall(app, [b"{"], declared=4096)
    await until(lambda: gate.current == 1)
    await asyncio.sleep(0.3)
    assert not call.task.done()
    call.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call.task


def test_the_flags_zero_turns_the_deadline_off() -> None:
    assert BodyDeadline.of(0, 1000) is None
    assert BodyDeadline.of(30, 0) == BodyDeadline(30, 1)
