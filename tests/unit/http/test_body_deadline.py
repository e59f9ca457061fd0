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

from ...support.asgi import BodyCall, until

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


async def test_stalled_bodies_holding_every_slot_are_let_go_and_a_normal_request_is_served():
    app, gate = deadline_app(BodyDeadline(timeout_s=0.3, min_rate=1 << 20))
    stalled = [BodyCall(app, "/work", [b"{"], declared=4096, ends=False) for _ in range(LIMIT)]
    await until(lambda: gate.current == LIMIT)
    refused = BodyCall(app, "/work", [b"{}"])
    assert (await refused.answer())[0] == 429  # every slot is held by a stalled body
    for call in stalled:
        status, headers, body = await call.answer()
        assert status == 408
        assert b'"body_timeout"' in body
        assert headers["connection"] == "close"
    assert gate.current == 0 and gate.held == 0
    normal = BodyCall(app, "/work", [b"{}"])
    assert (await normal.answer())[0] == 200


async def test_a_body_that_trickles_below_the_minimum_rate_is_refused_though_it_never_pauses():
    # Pieces 20 ms apart (never a pause of the 0.2 s timeout), at 50 bytes/s against 1000.
    app, gate = deadline_app(BodyDeadline(timeout_s=0.2, min_rate=1000))
    call = BodyCall(app, "/work", [b" "] * 1000, gap_s=0.02, ends=False)
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
        call = BodyCall(app, path, [b"x" * 100] * 5, gap_s=0.01)
        status, _, body = await call.answer()
        assert (status, body) == (200, b'{"length":500}')
    assert gate.current == 0


async def test_without_a_deadline_a_stalled_body_is_waited_for():
    app, gate = deadline_app(None)
    call = BodyCall(app, "/work", [b"{"], declared=4096, ends=False)
    await until(lambda: gate.current == 1)
    await asyncio.sleep(0.3)
    assert not call.task.done()
    call.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call.task


def test_the_flags_zero_turns_the_deadline_off() -> None:
    assert BodyDeadline.of(0, 1000) is None
    assert BodyDeadline.of(30, 0) == BodyDeadline(30, 1)
