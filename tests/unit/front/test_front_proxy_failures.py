"""The door as a proxy when things go wrong: a caller hanging up cancels the upstream request, an
upstream failing mid-stream ends the stream with a typed error event then ``[DONE]``, every
upstream answer and pending count is given back, resets and timeouts are typed 502/504, upstream
headers pass on every path, over-nested JSON is a 400, and a multi-prompt stream runs its
prompts at once. Upstreams that fail on the wire are real sockets (``BadNode``), so the door's
own httpx pool is what the tests look into."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem_front.app import create_app
from tandem_wire import GenerateRequest, WireFormat, encode_generate_requests
from tandem_wire.streams import (
    STREAM_CONTENT_TYPE,
    FrameReader,
    StreamFrameKind,
    accepts_stream_frames,
    decode_error,
    decode_event,
    encode_event_frame,
)
from tests.support.asgi import AsgiCall, BodyCall, app_client

from .test_front_routing import Fleet, fleet, generate_body, settings

pytestmark = pytest.mark.anyio

GENERATE = "/inference/v1/generate"
FIRST_EVENT = b'data: {"request_id":"r","choices":[{"index":0,"token_ids":[7]}]}\n\n'
FIRST_FRAME = encode_event_frame({"request_id": "r", "choices": [{"index": 0, "token_ids": [7]}]})


class BadNode:
    """A generate node on a real socket that misbehaves on cue: ``sse`` / ``json`` send the
    start of an answer then drop the connection, ``reset`` drops it before answering, ``hang``
    never answers, ``refused``: nothing listens on its port."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.accept = ""
        self.url = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def __aenter__(self) -> BadNode:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._server = server
        if self.mode == "refused":
            await self.__aexit__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET "):
                # The door's own checks (its weight-version poll): no such route here.
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                return
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            if self.mode == "sse":
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                    + f"{len(FIRST_EVENT):x}\r\n".encode()
                    + FIRST_EVENT
                    + b"\r\n"
                    # half of the next event, then the node dies
                    + b'a\r\ndata: {"re\r\n'
                )
            elif self.mode == "frames":  # the binary stream (tandem_wire.streams)
                self.accept = next(
                    line.split(b":", 1)[1].strip().decode()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"accept:")
                )
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.tandem.stream+msgpack\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                    + f"{len(FIRST_FRAME):x}\r\n".encode()
                    + FIRST_FRAME
                    + b"\r\n"
                    # the head of the next frame, then the node dies
                    + b"3\r\n\x01\x00\x00\r\n"
                )
            elif self.mode == "json":
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b'content-length: 100\r\n\r\n{"choices": ['
                )
            elif self.mode == "hang":
                await asyncio.sleep(3600)
            elif self.mode == "trickle":  # an answer that keeps its connection: an event
                writer.write(  # every 50 ms, well inside any read timeout
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                while True:
                    writer.write(f"{len(FIRST_EVENT):x}\r\n".encode() + FIRST_EVENT + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
            await writer.drain()
        finally:
            writer.close()


class Mixed(httpx.AsyncBaseTransport):
    """In-process ASGI apps for the hosts named, real sockets for the rest (the pool that
    tests look into, httpx's own, bounded by ``limits``)."""

    def __init__(self, apps: dict[str, Any], limits: httpx.Limits | None = None) -> None:
        self.asgi = {h: httpx.ASGITransport(app=a) for h, a in apps.items()}
        self.network = httpx.AsyncHTTPTransport(limits=limits or httpx.Limits())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        asgi = self.asgi.get(request.url.host)
        if asgi is not None:
            return await asgi.handle_async_request(request)
        return await self.network.handle_async_request(request)

    async def aclose(self) -> None:
        await self.network.aclose()

    def checked_out(self) -> int:
        """Connections the door holds for an answer it has not given back."""
        pool = self.network._pool
        busy = [c for c in pool.connections if not (c.is_idle() or c.is_closed())]
        return len(pool._requests) + len(busy)


# -- a render node and the tokenizer side, for the OpenAI routes -------------------------------


def render_app() -> Starlette:
    """Chat renders one request; completions one per prompt of ``prompt`` (a list or not)."""

    async def chat(request: Request) -> Response:
        return _rendered([GenerateRequest(token_ids=[1, 2])], single=True)

    async def completions(request: Request) -> Response:
        prompt = json.loads(await request.body())["prompt"]
        prompts = prompt if isinstance(prompt, list) else [prompt]
        return _rendered([GenerateRequest(token_ids=[1, 2 + i]) for i in range(len(prompts))])

    return Starlette(
        routes=[
            Route("/v1/chat/completions/render", chat, methods=["POST"]),
            Route("/v1/completions/render", completions, methods=["POST"]),
        ]
    )


def _rendered(reqs: list[GenerateRequest[Any]], single: bool = False) -> Response:
    raw = encode_generate_requests(reqs, WireFormat.MSGPACK)
    if single:
        raw = msgspec.msgpack.encode(msgspec.msgpack.decode(raw)[0])
    return Response(raw, media_type=WireFormat.MSGPACK.content_type)


def _text(ids: list[int] | None) -> str:
    return "".join(f"<{i}>" for i in ids or [])


class _Plan:
    """A stand-in answer side: each token id as ``<id>``; a chat stream's role goes out with
    the first event."""

    stream_end = b"data: [DONE]\n\n"

    def __init__(self, body: dict, chat: bool) -> None:
        self.chat = chat
        self.stream = bool(body.get("stream"))

    def sampling(self, rendered: dict) -> dict:
        return rendered

    async def whole(self, rid: str, model: str, gens: list, results: list) -> bytes:
        choices = [
            {"index": c.index, "text": _text(c.token_ids)} for r in results for c in r.choices
        ]
        return json.dumps({"id": rid, "model": model, "choices": choices}).encode()

    async def chunks(self, rid: str, model: str, gens: list, events: Any) -> AsyncIterator[bytes]:
        first = self.chat
        async for p, event in events:
            if first:
                first = False
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                yield _event({"id": rid, "choices": [role]})
            # An SSE event's JSON object, or a binary stream's struct (tandem_wire.streams).
            read = event if isinstance(event, dict) else msgspec.to_builtins(event)
            for c in read.get("choices") or ():
                text = _text(c.get("token_ids"))
                choice = {"index": p + c["index"]}
                choice.update({"delta": {"content": text}} if self.chat else {"text": text})
                yield _event({"id": rid, "choices": [choice]})


def _event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class Texts:
    """The answer side of the OpenAI routes, standing in for vLLM's."""

    vllm_version = "0.0.0-texts"

    def plan(self, body: dict, chat: bool, *, weight_versions: bool = False) -> _Plan:
        return _Plan(body, chat)

    def saw_fingerprint(self, fingerprint: str) -> None:
        pass


def events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            payload = block[6:]
            out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# -- 1. a caller hanging up ------------------------------------------------------------------


class Stuck(Fleet):
    """Generate requests never get an answer; ``cancelled`` is set when the door gives one up
    (as a closed connection makes a real node abort its engine request)."""

    def __init__(self) -> None:
        super().__init__(fleet().nodes)
        self.arrived = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.asgi = {"r1": httpx.ASGITransport(app=render_app())}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host in self.asgi:
            return await self.asgi[request.url.host].handle_async_request(request)
        if request.url.path != GENERATE:
            return await super().handle_async_request(request)
        self.arrived.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (GENERATE, generate_body("mine")),
        (GENERATE, generate_body("trl-0123")),  # the TRL-shaped path reads the answer whole
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"]}),
    ],
    ids=["pass-through", "trl", "chat", "completions"],
)
async def test_a_caller_hanging_up_cancels_its_non_streamed_upstream_request(path, body):
    f = Stuck()
    app = create_app(settings(render_urls=("http://r1",)), Texts(), f)
    async with app_client(app):
        raw = json.dumps(body).encode()
        call = AsgiCall(app, "POST", path, raw, {"content-type": "application/json"})
        await asyncio.wait_for(f.arrived.wait(), 10)
        await call.hang_up()
        # Before, the door waited on for an answer nobody would read.
        await asyncio.wait_for(f.cancelled.wait(), 10)
        assert [n.pending for n in app.state.upstreams.generate] == [0, 0, 0]


class OneRefused(Stuck):
    """A two-prompt completion: prompt 1 is refused at once, prompt 0 gets no answer."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == GENERATE:
            rid = msgspec.msgpack.decode(await request.aread())["request_id"]
            if rid.endswith("-1"):
                await self.arrived.wait()  # prompt 0 is under way
                error = {"error": {"type": "overloaded", "message": "busy"}}
                return httpx.Response(429, json=error, headers={"retry-after": "2"})
        return await super().handle_async_request(request)


async def test_a_prompt_refused_stops_the_other_prompts_of_its_request():
    f = OneRefused()
    app = create_app(settings(render_urls=("http://r1",)), Texts(), f)
    async with app_client(app) as c:
        r = await c.post("/v1/completions", json={"model": "m", "prompt": ["a", "b"]})
        assert (r.status_code, r.headers["retry-after"]) == (429, "2")
        # Before, prompt 0 ran on, for an answer already given.
        await asyncio.wait_for(f.cancelled.wait(), 10)
        assert [n.pending for n in app.state.upstreams.generate] == [0, 0, 0]


# -- 2 and 3. an upstream dying mid-answer ---------------------------------------------------


async def test_an_sse_pass_through_cut_mid_answer_ends_with_an_error_event_and_is_released():
    async with BadNode("sse") as node:
        transport = Mixed({})
        app = create_app(settings(generate_urls=(node.url,)), Texts(), transport)
        async with app_client(app) as c:
            body = {**generate_body(), "stream": True}
            r = await c.post(GENERATE, json=body)
            gen = app.state.upstreams.generate[0]
            assert (gen.pending, transport.checked_out()) == (0, 0)
        await transport.aclose()
    assert r.status_code == 200
    first, error, done = events(r.content)  # the half-sent event is not passed on
    assert first["choices"][0]["token_ids"] == [7]
    assert error["error"]["type"] == "upstream_error" and error["error"]["code"] == 502
    assert done == "[DONE]"


async def test_a_binary_stream_pass_through_cut_mid_answer_ends_with_an_error_frame():
    async with BadNode("frames") as node:
        transport = Mixed({})
        app = create_app(settings(generate_urls=(node.url,)), Texts(), transport)
        async with app_client(app) as c:
            body = {**generate_body(), "stream": True}
            r = await c.post(GENERATE, json=body, headers={"accept": STREAM_CONTENT_TYPE})
            gen = app.state.upstreams.generate[0]
            assert (gen.pending, transport.checked_out()) == (0, 0)
        await transport.aclose()
    assert node.accept == STREAM_CONTENT_TYPE  # the caller's, passed on
    assert r.status_code == 200 and r.headers["content-type"] == STREAM_CONTENT_TYPE
    reader = FrameReader()
    (first, error) = reader.feed(r.content)  # the half-sent frame is not passed on
    reader.finish()  # ended whole, by its error
    assert first[0] is StreamFrameKind.EVENT and r.content.startswith(FIRST_FRAME)
    assert decode_event(first[1], dict)["choices"][0]["token_ids"] == [7]
    assert error[0] is StreamFrameKind.ERROR
    info = decode_error(error[1]).error
    assert (info.type, info.code) == ("upstream_error", 502)


async def test_a_json_answer_cut_mid_body_is_cut_for_the_caller_and_released():
    async with BadNode("json") as node:
        transport = Mixed({})
        app = create_app(settings(generate_urls=(node.url,)), Texts(), transport)
        async with app_client(app):
            raw = json.dumps(generate_body()).encode()
            call = AsgiCall(app, "POST", GENERATE, raw, {"content-type": "application/json"})
            assert await call.status() == 200
            assert await call.chunk() == b'{"choices": ['
            await asyncio.wait({call.task}, timeout=10)
            gen = app.state.upstreams.generate[0]
            assert (gen.pending, transport.checked_out()) == (0, 0)
            assert call.task.done() and call.task.exception() is None
            sent = []
            while not call.messages.empty():
                sent.append(call.messages.get_nowait())
            # The answer's end is never sent: the server drops the caller's connection.
            assert all(m.get("more_body") for m in sent)
        await transport.aclose()


@pytest.mark.parametrize("answer", ["sse", "frames"])
async def test_an_openai_stream_cut_mid_answer_ends_with_an_error_event_and_is_released(answer):
    # A node answering SSE, or the binary stream the door asks for.
    async with BadNode(answer) as node:
        transport = Mixed({"r1": render_app()})
        s = settings(render_urls=("http://r1",), generate_urls=(node.url,))
        app = create_app(s, Texts(), transport)
        async with app_client(app) as c:
            r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
            gen = app.state.upstreams.generate[0]
            assert (gen.pending, transport.checked_out()) == (0, 0)
        await transport.aclose()
    if answer == "frames":
        assert accepts_stream_frames(node.accept)  # the door asked for the binary stream
    assert r.status_code == 200
    role, token, error, done = events(r.content)
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert token["choices"][0]["delta"]["content"] == "<7>"
    assert error["error"]["type"] == "upstream_error"
    assert done == "[DONE]"


# -- 5. typed failures before the answer -----------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "status", "type_"),
    [
        ("refused", 503, "upstream_unavailable"),
        ("hang", 504, "upstream_timeout"),
        ("reset", 502, "upstream_error"),
    ],
)
@pytest.mark.parametrize("path", [GENERATE, "/v1/chat/completions"])
async def test_connect_failure_timeout_and_reset_are_typed(mode, status, type_, path):
    async with BadNode(mode) as node:
        transport = Mixed({"r1": render_app()})
        # Short only where the timeout is the point: elsewhere a loaded machine's pause before
        # the refusal or the reset must not turn it into a timeout.
        timeout = 0.5 if mode == "hang" else 30.0
        s = settings(render_urls=("http://r1",), generate_urls=(node.url,), read_timeout_s=timeout)
        app = create_app(s, Texts(), transport)
        async with app_client(app, raise_app_exceptions=False) as c:
            r = await c.post(path, json=generate_body() if path == GENERATE else CHAT)
            gen = app.state.upstreams.generate[0]
            assert (gen.pending, transport.checked_out()) == (0, 0)
        await transport.aclose()
    assert r.status_code == status
    assert r.json()["error"]["type"] == type_


async def test_a_full_pool_is_the_doors_own_and_no_node_is_blamed():
    # One connection in the door's pool, held by a stream the node keeps sending: the next
    # request waits the pool's timeout (the read timeout) and never leaves the door.
    async with BadNode("trickle") as node:
        transport = Mixed({"r1": render_app()}, httpx.Limits(max_connections=1))
        s = settings(
            render_urls=("http://r1",),
            generate_urls=(node.url,),
            read_timeout_s=0.5,
            control_timeout_s=0.5,
        )
        app = create_app(s, Texts(), transport)
        async with app_client(app, raise_app_exceptions=False) as c:
            raw = json.dumps(generate_body("held")).encode()
            held = AsgiCall(app, "POST", GENERATE, raw, {"content-type": "application/json"})
            assert await held.status() == 200
            assert FIRST_EVENT in await held.chunk()  # the pool's one connection is taken
            r = await c.post(GENERATE, json=generate_body("second"))
            gen = app.state.upstreams.generate[0]
            # And a control call (the fleet's poll, an update step) through the same pool.
            asked = await app.state.upstreams.ask(gen, "GET", "/weight_info", b"", {})
            blamed = (gen.down_until, gen.unreachable_since)
            await held.hang_up()
            assert (gen.pending, transport.checked_out()) == (0, 0)
        await transport.aclose()
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "overloaded"
    assert asked.status == 0  # not asked: the step it was part of failed on it
    assert blamed == (0.0, None)  # not cooled down, not unreachable: it was never asked


# -- 4. upstream headers on every path -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (GENERATE, generate_body("mine")),
        (GENERATE, generate_body("trl-0123")),
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"], "stream": True}),
    ],
    ids=["pass-through", "trl", "chat", "chat-stream", "completions-stream"],
)
@pytest.mark.parametrize("status", [429, 503])
async def test_retry_after_from_generate_reaches_the_caller_on_every_path(path, body, status):
    f = fleet()
    f.transports["r1"] = httpx.ASGITransport(app=render_app())
    for name in ("g1", "g2", "g3"):
        f.nodes[name].status = status
        f.nodes[name].headers = {"retry-after": "7"}
    app = create_app(settings(render_urls=("http://r1",)), Texts(), f)
    async with app_client(app) as c:
        r = await c.post(path, json=body)
        assert [n.pending for n in app.state.upstreams.generate] == [0, 0, 0]
    assert r.status_code == status
    assert r.headers["retry-after"] == "7"
    assert r.json()["error"]["message"].startswith("from g")


# -- 6. malformed and over-nested JSON -------------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        (GENERATE, '{"request_id": "r", "token_ids": [1], "extra": ' + DEEP + "}"),
        ("/v1/chat/completions", '{"messages": ' + DEEP + "}"),
        ("/v1/completions", '{"prompt": ' + DEEP + "}"),
        ("/v1/chat/completions", '{"messages": [}'),
        ("/init_weight_transfer_engine", '{"init_info": ' + DEEP + "}"),
    ],
    ids=["generate", "chat", "completions", "malformed", "control"],
)
async def test_malformed_or_over_nested_json_is_a_typed_400(path, raw):
    f = fleet()
    app = create_app(settings(), Texts(), f)
    async with app_client(app, raise_app_exceptions=False) as c:
        r = await c.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] in ("malformed_body", "invalid_request")
    assert not any(n.seen for n in f.nodes.values())


# -- 7. multi-prompt streams run concurrently ------------------------------------------------


class Interleaved(httpx.AsyncBaseTransport):
    """Generate streams for a two-prompt completion: prompt 0 sends one token, then holds its
    last until prompt 1 has sent its own; prompt 1 starts only if the door asks for it."""

    def __init__(self) -> None:
        self.render = httpx.ASGITransport(app=render_app())
        self.second_sent = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            return await self.render.handle_async_request(request)
        if request.method == "GET":  # the door's weight-version poll: not part of this test
            return httpx.Response(404)
        rid = msgspec.msgpack.decode(await request.aread())["request_id"]
        stream = _Stream(self._first() if rid.endswith("-0") else self._second())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    async def _first(self) -> AsyncIterator[bytes]:
        yield _token_event(10)
        await self.second_sent.wait()
        yield _token_event(11, "length")
        yield b"data: [DONE]\n\n"

    async def _second(self) -> AsyncIterator[bytes]:
        yield _token_event(20, "length")
        self.second_sent.set()
        yield b"data: [DONE]\n\n"


class _Stream(httpx.AsyncByteStream):
    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self.source = source

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.source:
            yield chunk


def _token_event(token: int, finish: str | None = None) -> bytes:
    choice = {"index": 0, "token_ids": [token], "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


async def test_a_multi_prompt_stream_runs_its_prompts_at_once():
    t = Interleaved()
    app = create_app(settings(render_urls=("http://r1",), generate_urls=("http://g1",)), Texts(), t)
    body = {"model": "m", "prompt": ["a", "b"], "stream": True}
    async with app_client(app) as c:
        # One after the other, prompt 0 would wait for prompt 1 for ever.
        r = await asyncio.wait_for(c.post("/v1/completions", json=body), 10)
    chunks = events(r.content)
    assert chunks[-1] == "[DONE]"
    order = [(ch["choices"][0]["index"], ch["choices"][0]["text"]) for ch in chunks[:-1]]
    assert order == [(0, "<10>"), (1, "<20>"), (0, "<11>")]


# -- admission on every POST route -----------------------------------------------------------


HEALTH_PROBES = {"/ping"}
"""POST routes that are health probes (SageMaker's ``/ping``): answered like ``/health``, never
refused for load, or a full door would be restarted by its orchestrator."""


def _post_paths() -> list[str]:
    app = create_app(settings(), Texts(), fleet())
    posts = {r.path for r in app.routes if "POST" in (getattr(r, "methods", None) or ())}
    return sorted(posts - HEALTH_PROBES)


@pytest.mark.parametrize("path", _post_paths())
async def test_every_post_route_is_refused_before_its_body_is_read_when_the_door_is_full(path):
    # One request in flight fills a door that admits one: any route added without
    # tandem_http's gate would read the next body instead of answering 429.
    f = Stuck()
    app = create_app(settings(render_urls=("http://r1",), max_pending=1), Texts(), f)
    async with app_client(app):
        raw = json.dumps(generate_body()).encode()
        holder = AsgiCall(app, "POST", GENERATE, raw, {"content-type": "application/json"})
        await asyncio.wait_for(f.arrived.wait(), 10)
        refused = BodyCall(app, path, [b"{}"])
        status, _, body = await refused.answer()
        assert (status, json.loads(body)["error"]["type"]) == (429, "overloaded")
        assert refused.asked == 0
        await holder.hang_up()
