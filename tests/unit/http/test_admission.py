"""The admission gate: refusals before any work, slots held until the answer is sent."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import zstandard
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry

import tandem_http.body as http_body
from tandem_http import (
    AdmissionGate,
    Overloaded,
    admitted,
    install_error_handlers,
    read_body,
)
from tandem_wire import PayloadTooLarge, compress_zstd

from ...support.asgi import AsgiCall, BodyCall, until

pytestmark = pytest.mark.anyio


def gate_app(limit: int, max_bytes: int | None = None) -> tuple[FastAPI, AdmissionGate, dict]:
    registry = CollectorRegistry()
    gate = AdmissionGate(limit, "tandem_test", registry, max_bytes=max_bytes)
    seen = {"bodies_read": 0, "streams_started": 0}
    release = asyncio.Event()
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/work")
    @admitted(gate)
    async def work(request: Request) -> Response:
        await read_body(request, 1 << 20)
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

        return StreamingResponse(body(), media_type="text/plain")

    @app.post("/fail")
    @admitted(gate)
    async def fail(request: Request) -> Response:
        await read_body(request, 1 << 20)
        raise RuntimeError("handler failed")

    @app.post("/quick")
    @admitted(gate)
    async def quick(request: Request) -> Response:
        return JSONResponse({"length": len(await read_body(request, 1 << 20))})

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


# Admission by bytes: the bodies a process holds, counted before they are read.


async def test_past_the_byte_budget_the_answer_is_429_before_any_of_the_body_is_read() -> None:
    app, gate, seen = gate_app(limit=10, max_bytes=1000)
    holder = BodyCall(app, "/work", [b"a" * 700])
    await until(lambda: seen["bodies_read"] == 1)
    refused = BodyCall(app, "/work", [b"b" * 200, b"c" * 200])  # 700 + 400 > 1000
    status, headers, body = await refused.answer()
    assert status == 429
    assert headers["retry-after"] == "1"
    assert b'"overloaded"' in body
    assert refused.asked == 0  # not one body message was taken from the client
    assert seen["bodies_read"] == 1
    fits = BodyCall(app, "/quick", [b"d" * 300])  # 700 + 300: exactly the budget
    assert (await fits.answer())[0] == 200
    app.state.release.set()
    assert (await holder.answer())[0] == 200
    assert gate.held == 0
    assert app.state.registry.get_sample_value("tandem_test_held_bytes") == 0.0


async def test_a_body_larger_than_the_whole_budget_is_413_unread() -> None:
    app, gate, seen = gate_app(limit=10, max_bytes=1000)
    call = BodyCall(app, "/quick", [b"x" * 1001])
    status, _, body = await call.answer()
    assert status == 413
    assert b'"payload_too_large"' in body
    assert call.asked == 0
    # A chunked body that passes the whole budget on its own is 413 too, as it is read.
    call = BodyCall(app, "/quick", [b"x" * 600, b"y" * 600, b"z" * 600], declare=False)
    assert (await call.answer())[0] == 413
    assert call.asked == 2
    assert gate.held == 0


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_budget() -> None:
    app, gate, seen = gate_app(limit=10, max_bytes=1000)
    holder = BodyCall(app, "/work", [b"a" * 600])
    await until(lambda: seen["bodies_read"] == 1)
    chunked = BodyCall(app, "/quick", [b"x" * 200] * 10, declare=False)
    status, headers, _ = await chunked.answer()
    assert (status, headers["retry-after"]) == (429, "1")
    assert chunked.asked == 3  # 600 + 200 + 200 fit; the third chunk passed the budget
    assert gate.held == 600  # the refused request's bytes came back at once
    app.state.release.set()
    await holder.answer()
    assert gate.held == 0


async def test_bytes_come_back_after_an_answer_an_error_a_stream_and_a_client_leaving() -> None:
    app, gate, seen = gate_app(limit=10, max_bytes=1000)
    whole = [b"w" * 1000]  # admitted only when nothing else is held

    async def admitted_whole() -> bool:
        return (await BodyCall(app, "/quick", whole).answer())[0] == 200

    assert (await BodyCall(app, "/quick", [b"q" * 900]).answer())[0] == 200
    assert await admitted_whole()
    assert (await BodyCall(app, "/fail", [b"f" * 900]).answer())[0] == 500
    assert await admitted_whole()

    stream = AsgiCall(app, "POST", "/stream", b"s" * 900, {"content-length": "900"})
    assert await stream.status() == 200
    assert await stream.chunk() == b"first\n"
    assert (await BodyCall(app, "/quick", [b"n" * 200]).answer())[0] == 429  # held mid-stream
    app.state.release.set()
    assert await stream.chunk() == b"last\n"
    await asyncio.wait_for(stream.task, 10)
    assert await admitted_whole()

    app.state.release.clear()
    leaving = AsgiCall(app, "POST", "/stream", b"s" * 900, {"content-length": "900"})
    assert await leaving.status() == 200
    assert await leaving.chunk() == b"first\n"
    await leaving.hang_up()
    assert await admitted_whole()
    assert gate.held == 0 and gate.current == 0


async def test_a_decoded_copy_is_held_too() -> None:
    app, gate, seen = gate_app(limit=10, max_bytes=10_000)
    frame = compress_zstd(bytes(8000))  # tiny on the wire, 8000 bytes once decoded
    holder = AsgiCall(
        app,
        "POST",
        "/work",
        frame,
        {"content-length": str(len(frame)), "content-encoding": "zstd"},
    )
    await until(lambda: seen["bodies_read"] == 1)
    assert gate.held == len(frame) + 8000
    refused = BodyCall(app, "/quick", [b"x" * 2000])
    assert (await refused.answer())[0] == 429
    assert refused.asked == 0
    app.state.release.set()
    assert await holder.status() == 200
    await asyncio.wait_for(holder.task, 10)
    assert gate.held == 0


def test_the_gate_counts_bytes_beside_requests() -> None:
    gate = AdmissionGate(5, "tandem_bytes", CollectorRegistry(), max_bytes=100)
    with pytest.raises(PayloadTooLarge):
        gate.admit(101)
    first = gate.admit(60)
    first.charge(30)  # what the service decoded: held, never refused
    with pytest.raises(Overloaded):
        gate.admit(11)
    second = gate.admit(10)
    first.release()
    assert gate.held == 10
    second.release()
    assert (gate.held, gate.current) == (0, 0)
    unbounded = AdmissionGate(5, "tandem_nobudget", CollectorRegistry(), max_bytes=0)
    unbounded.admit(1 << 40).release()


# Decoded copies: charged before they are allocated, within the room the budget has left.


def zstd_call(app, path: str, frame: bytes) -> AsgiCall:
    headers = {"content-length": str(len(frame)), "content-encoding": "zstd"}
    return AsgiCall(app, "POST", path, frame, headers)


class Inflated:
    """The bytes decode_body was asked to produce at most, call by call (its cap)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.caps: list[int] = []
        real = http_body.decode_body

        def decode(body: bytes, coding: str, max_bytes: int) -> bytes:
            self.caps.append(max_bytes)
            return real(body, coding, max_bytes)

        monkeypatch.setattr(http_body, "decode_body", decode)


async def test_small_bodies_that_inflate_past_the_budget_are_refused_before_they_inflate(
    monkeypatch,
) -> None:
    # 8 bodies of a few hundred bytes, each declaring 64 KiB decoded, against 100 KiB: before,
    # each was charged its wire size, inflated whole and held uncharged (512 KiB held).
    inflated = Inflated(monkeypatch)
    app, gate, seen = gate_app(limit=10, max_bytes=100 * 1024)
    frame = compress_zstd(bytes(64 * 1024))
    calls = [zstd_call(app, "/work", frame) for _ in range(8)]
    await until(lambda: seen["bodies_read"] == 1 and sum(c.task.done() for c in calls) == 7)
    statuses = sorted([await c.status() for c in calls if c.task.done()])
    assert statuses == [429] * 7
    assert inflated.caps == [64 * 1024]  # the seven were refused from the frame's header
    assert gate.held == len(frame) + 64 * 1024 <= 100 * 1024
    app.state.release.set()
    await asyncio.wait_for(asyncio.gather(*(c.task for c in calls)), 10)
    assert gate.held == 0 and gate.current == 0


async def test_a_frame_that_does_not_declare_its_size_inflates_into_the_room_left_only(
    monkeypatch,
) -> None:
    inflated = Inflated(monkeypatch)
    app, gate, seen = gate_app(limit=10, max_bytes=100 * 1024)
    holder = BodyCall(app, "/work", [b"a" * 30_000])
    await until(lambda: seen["bodies_read"] == 1)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(90_000))
    call = zstd_call(app, "/quick", unsized)
    assert await call.status() == 429  # 90 000 decoded do not fit beside the 30 000 held
    room = 100 * 1024 - 30_000 - len(unsized)
    assert inflated.caps == [room]  # inflated into the room, not the route's 1 MiB cap
    assert gate.held == 30_000
    app.state.release.set()
    assert (await holder.answer())[0] == 200
    call = zstd_call(app, "/quick", unsized)
    assert await call.status() == 200  # alone, it fits
    await asyncio.wait_for(call.task, 10)
    alone = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(200_000))
    call = zstd_call(app, "/quick", alone)
    assert await call.status() == 413  # it passes the room of an empty process: never fits
    assert gate.held == 0


async def test_a_decode_runs_off_the_event_loop(monkeypatch) -> None:
    # The decode is held in its thread until a plain request has been answered: on the
    # event loop it would hold that request too.
    started, go = threading.Event(), threading.Event()
    released: list[bool] = []
    real = http_body.decode_body

    def held(body: bytes, coding: str, max_bytes: int) -> bytes:
        started.set()
        released.append(go.wait(10))  # False: it gave up, nothing else could run meanwhile
        return real(body, coding, max_bytes)

    monkeypatch.setattr(http_body, "decode_body", held)
    app, gate, seen = gate_app(limit=10, max_bytes=1 << 20)
    call = zstd_call(app, "/quick", compress_zstd(bytes(8000)))
    await until(started.is_set)
    plain = BodyCall(app, "/quick", [b"x" * 10])
    assert (await plain.answer())[0] == 200
    go.set()
    assert await call.status() == 200
    await asyncio.wait_for(call.task, 10)
    assert released == [True], "the decode held the event loop"
