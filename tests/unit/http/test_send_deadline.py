"""Answers on a deadline: a caller that stops reading (or reads too slowly) is cut off, its
admission slot given back and a stream's producer stopped; one that reads, however long its
answer waits on the producer, is served whole. The connection here is a stand-in for uvicorn's
request cycle (its ``send`` waits while the transport's buffer is over the high-water mark),
read by a caller at a chosen rate; the real server is driven in
``tests/integration/test_hostile_budgets.py``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry

from tandem_http import (
    AdmissionGate,
    PartsResponse,
    SendDeadline,
    SendDeadlineMiddleware,
    TransportInScope,
    admitted,
    install_error_handlers,
)

pytestmark = pytest.mark.anyio

HIGH_WATER = 64 * 1024
PART = 256 * 1024


class Transport:
    """The bytes written and not yet read by the caller, and whether it was aborted."""

    def __init__(self) -> None:
        self.buffered = 0
        self.read = 0
        self.aborted = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.gone = asyncio.Event()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.buffered += len(data)
        if self.buffered > HIGH_WATER:
            self.writable.clear()

    def take(self, nbytes: int) -> None:
        n = min(nbytes, self.buffered)
        self.buffered -= n
        self.read += n
        if self.buffered <= HIGH_WATER // 4:
            self.writable.set()

    def abort(self) -> None:
        self.aborted = True
        self.buffered = 0
        self.writable.set()
        self.gone.set()


class Cycle:
    """uvicorn's request cycle as the app sees it: ``send`` waits while writing is paused and
    does nothing once the caller left; ``receive`` gives the body, then waits for the caller to
    leave."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.complete = False
        self._body_given = False

    async def send(self, message: dict) -> None:
        if not self.transport.writable.is_set():
            await self.transport.writable.wait()
        if self.transport.aborted:
            return
        if message["type"] == "http.response.body":
            self.transport.write(message.get("body", b""))
            self.complete = not message.get("more_body", False)

    async def receive(self) -> dict:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.transport.gone.wait()
        return {"type": "http.disconnect"}


def deadline_app(deadline: SendDeadline | None) -> tuple[TransportInScope, AdmissionGate, dict]:
    gate = AdmissionGate(4, "tandem_send_deadline", CollectorRegistry())
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(SendDeadlineMiddleware, deadline=deadline)
    seen: dict = {"closed": False, "chunks": 0}

    @app.get("/parts")
    @admitted(gate)
    async def parts(request: Request) -> Response:
        return PartsResponse([b"x" * PART] * 4)

    @app.get("/stream")
    @admitted(gate)
    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            try:
                while True:
                    seen["chunks"] += 1
                    yield b"data: " + b"x" * 4096 + b"\n\n"
                    await asyncio.sleep(0)
            finally:
                seen["closed"] = True

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/slow-producer")
    @admitted(gate)
    async def slow_producer(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            for _ in range(3):
                await asyncio.sleep(0.15)  # the engine's time, not the caller's
                yield b"data: x\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return TransportInScope(app), gate, seen


def scope(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }


async def read_at(transport: Transport, rate: float, stop: asyncio.Event) -> None:
    """The caller reads ``rate`` bytes a second until ``stop``."""
    while not stop.is_set():
        await asyncio.sleep(0.01)
        transport.take(int(rate * 0.01))


async def serve(app, path: str, rate: float) -> tuple[Transport, Cycle]:
    transport = Transport()
    cycle = Cycle(transport)
    stop = asyncio.Event()
    reader = asyncio.create_task(read_at(transport, rate, stop))
    try:
        await asyncio.wait_for(app(scope(path), cycle.receive, cycle.send), 10)
    finally:
        stop.set()
        await reader
    return transport, cycle


@pytest.mark.parametrize("path", ["/parts", "/stream"])
async def test_a_caller_that_never_reads_is_cut_and_its_slot_given_back(path):
    app, gate, seen = deadline_app(SendDeadline(timeout_s=0.3, min_rate=1 << 30))
    transport, cycle = await serve(app, path, rate=0)
    assert transport.aborted and not cycle.complete
    assert gate.current == 0
    if path == "/stream":
        assert seen["closed"]  # the producer (an engine request) was stopped


async def test_a_caller_reading_below_the_minimum_rate_is_cut_though_no_write_waits_long():
    # 1 MiB at 200 KiB/s: no write waits the 0.3 s timeout, but the whole waits past the
    # grace plus the bytes over 1 MiB/s.
    app, gate, _ = deadline_app(SendDeadline(timeout_s=0.3, min_rate=1 << 20))
    transport, cycle = await serve(app, "/parts", rate=200 * 1024)
    assert transport.aborted and not cycle.complete
    assert 0 < transport.read < 4 * PART
    assert gate.current == 0


async def test_a_caller_reading_at_the_rate_gets_the_whole_answer_and_holds_its_slot_until_then():
    app, gate, _ = deadline_app(SendDeadline(timeout_s=0.3, min_rate=1 << 20))
    transport = Transport()
    cycle = Cycle(transport)
    call = asyncio.create_task(app(scope("/parts"), cycle.receive, cycle.send))
    while not cycle.complete:
        transport.take(64 * 1024)
        await asyncio.sleep(0.01)
    # Every byte handed to the server: the answer still holds its slot until they are read.
    assert transport.buffered > 0
    await asyncio.sleep(0.05)
    assert gate.current == 1 and not call.done()
    while not call.done():
        transport.take(64 * 1024)
        await asyncio.sleep(0.01)
    await call
    assert not transport.aborted
    assert transport.read == 4 * PART
    assert gate.current == 0


async def test_time_spent_waiting_on_the_producer_is_not_the_callers():
    app, gate, _ = deadline_app(SendDeadline(timeout_s=0.1, min_rate=1 << 20))
    transport, cycle = await serve(app, "/slow-producer", rate=1 << 20)
    assert cycle.complete and not transport.aborted
    assert gate.current == 0


async def test_without_a_deadline_a_caller_that_never_reads_is_waited_for():
    app, gate, _ = deadline_app(None)
    transport = Transport()
    cycle = Cycle(transport)
    call = asyncio.create_task(app(scope("/parts"), cycle.receive, cycle.send))
    await asyncio.sleep(0.5)
    assert not call.done() and gate.current == 1
    transport.abort()  # the caller leaves
    await asyncio.wait_for(call, 5)
    assert gate.current == 0


def test_the_flags_zero_turns_the_deadline_off() -> None:
    assert SendDeadline.of(0, 1000) is None
    assert SendDeadline.of(30, 0) == SendDeadline(30, 1)


# -- over a real socket: uvicorn's own send waits on TCP flow control --------------------------


def serve_big_answers(deadline: SendDeadline | None):
    """A DrainingServer on a free port in a thread, one route answering 16 MiB: (url, gate,
    stop)."""
    import socket
    import threading

    from tandem_http import Drain, DrainingConfig, DrainingServer, service_app

    gate = AdmissionGate(4, "tandem_send_real", CollectorRegistry())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield

    app = service_app("t", lifespan, None, send_deadline=deadline)

    @app.post("/big")
    @admitted(gate)
    async def big(request: Request) -> Response:
        return PartsResponse([b"x" * (4 << 20)] * 4)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = DrainingConfig(app, drain=Drain(), host="127.0.0.1", port=port, log_level="warning")
    server = DrainingServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)

    return f"http://127.0.0.1:{port}", gate, stop


def test_a_real_server_cuts_a_caller_that_never_reads_and_frees_its_slot():
    from tools.hostile import NonReaders

    url, gate, stop = serve_big_answers(SendDeadline(timeout_s=0.5, min_rate=1 << 20))
    try:
        with NonReaders(url, "/big", 1, b"{}") as unread:
            deadline = time.monotonic() + 10
            while (gate.current or not unread.cut()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gate.current == 0 and unread.cut() == 1
    finally:
        stop()


def test_without_a_deadline_a_real_server_waits_on_a_caller_that_never_reads():
    from tools.hostile import NonReaders

    url, gate, stop = serve_big_answers(None)
    try:
        with NonReaders(url, "/big", 1, b"{}") as unread:
            deadline = time.monotonic() + 10
            while not gate.current and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)
            assert gate.current == 1 and unread.cut() == 0  # held for as long as it stays
    finally:
        stop()
