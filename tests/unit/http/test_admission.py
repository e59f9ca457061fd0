"""The admission gate: refusals before any work, slots held until the answer is sent."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_http import (
    AdmissionGate,
    HeldStreamingResponse,
    Overloaded,
    admitted,
    install_error_handlers,
)

from ...support.asgi import AsgiCall

pytestmark = pytest.mark.anyio


def gate_app(limit: int) -> tuple[FastAPI, AdmissionGate, dict]:
    registry = CollectorRegistry()
    gate = AdmissionGate(limit, "tandem_test", registry)
    seen = {"bodies_read": 0, "streams_started": 0}
    release = asyncio.Event()
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/work")
    @admitted(gate)
    async def work(request: Request) -> Response:
        await request.body()
        seen["bodies_read"] += 1
        await release.wait()
        return JSONResponse({"ok": True})

    @app.post("/stream")
    @admitted(gate)
    async def stream(request: Request) -> Response:
        async def body():
            seen["streams_started"] += 1
            yield b"first\n"
            await release.wait()
            yield b"last\n"

        return HeldStreamingResponse(body(), media_type="text/plain")

    @app.post("/fail")
    @admitted(gate)
    async def fail(request: Request) -> Response:
        raise RuntimeError("handler failed")

    app.state.release = release
    app.state.registry = registry
    return app, gate, seen


def client(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://app")


def test_a_slot_is_released_once() -> None:
    gate = AdmissionGate(1, "tandem_once", CollectorRegistry())
    slot = gate.admit()
    with pytest.raises(Overloaded):
        gate.admit()
    slot.release()
    slot.release()
    assert gate.current == 0
    gate.admit()
    assert gate.current == 1


async def test_past_the_limit_the_answer_is_429_before_the_body_is_read() -> None:
    app, gate, seen = gate_app(limit=1)
    async with client(app) as c:
        first = asyncio.create_task(c.post("/work", content=b"x" * 1000))
        while seen["bodies_read"] == 0:
            await asyncio.sleep(0.01)
        refused = await c.post("/work", content=b"y" * 1000)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
        assert seen["bodies_read"] == 1  # the refused request's handler never ran
        app.state.release.set()
        assert (await first).status_code == 200
    registry = app.state.registry
    assert registry.get_sample_value("tandem_test_rejected_total") == 1.0
    assert registry.get_sample_value("tandem_test_pending") == 0.0


async def test_a_stream_holds_its_slot_until_its_last_chunk() -> None:
    app, gate, seen = gate_app(limit=1)
    stream = AsgiCall(app, "POST", "/stream")
    assert await stream.status() == 200
    assert await stream.chunk() == b"first\n"
    async with client(app) as c:
        assert (await c.post("/work")).status_code == 429
        app.state.release.set()
        assert await stream.chunk() == b"last\n"
        await asyncio.wait_for(stream.task, 10)
        assert (await c.post("/work")).status_code == 200


async def test_a_stream_whose_client_leaves_frees_its_slot() -> None:
    app, gate, seen = gate_app(limit=1)
    stream = AsgiCall(app, "POST", "/stream")
    assert await stream.status() == 200
    assert await stream.chunk() == b"first\n"
    await stream.hang_up()  # mid-stream: the body never reaches its last chunk
    app.state.release.set()
    async with client(app) as c:
        assert (await c.post("/work")).status_code == 200


async def test_a_failing_handler_frees_its_slot() -> None:
    app, gate, seen = gate_app(limit=1)
    app.state.release.set()
    async with client(app) as c:
        assert (await c.post("/fail")).status_code == 500
        assert (await c.post("/fail")).status_code == 500  # not 429: the first slot came back
        assert (await c.post("/work")).status_code == 200
