"""The door's OpenAI routes hold render's answer against the request's admission bytes: read
with the generate nodes' cap, charged as it arrives, and let go (only token ids, sampling and
ids kept) once generate has the request, streams included."""

from __future__ import annotations

import asyncio
import gc
import re
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem_front.app import create_app
from tandem_front.proxy import _read_capped
from tandem_wire import GenerateRequest, MultiModalFeatures, PayloadTooLarge
from tests.support.asgi import AsgiCall, app_client

from .test_front_proxy_failures import CHAT, Texts, _rendered, _Stream, _token_event
from .test_front_routing import settings

pytestmark = pytest.mark.anyio

PROMPT = [1000] * 50_000  # ~150 KB of msgpack: render's answer, 2 KB of chat asked for it


class Fleet(httpx.AsyncBaseTransport):
    """Render answers PROMPT; generate streams one token once ``go`` is set."""

    def __init__(self) -> None:
        async def render(request: Request) -> Response:
            rendered = GenerateRequest(token_ids=PROMPT, sampling_params={"max_tokens": 1})
            return _rendered([rendered], single=True)

        app = Starlette(routes=[Route("/v1/chat/completions/render", render, methods=["POST"])])
        self.render = httpx.ASGITransport(app=app)
        self.go = asyncio.Event()
        self.generate_bodies: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            return await self.render.handle_async_request(request)
        if request.method == "GET":
            return httpx.Response(404)
        # Counted as it streams by (``aread`` would keep a copy on the door's request).
        self.generate_bodies.append(sum([len(piece) async for piece in request.stream]))  # type: ignore[union-attr]
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Stream(self._events())
        )

    async def _events(self) -> AsyncIterator[bytes]:
        await self.go.wait()
        yield _token_event(5, "length")
        yield b"data: [DONE]\n\n"


def door(**kw):
    fleet = Fleet()
    s = settings(render_urls=("http://r1",), generate_urls=("http://g1",), **kw)
    return create_app(s, Texts(), fleet), fleet


async def held(c: httpx.AsyncClient) -> int:
    text = (await c.get("/metrics")).text
    return int(float(re.search(r"^tandem_front_held_bytes (\S+)$", text, re.M).group(1)))


async def test_renders_answer_is_charged_to_the_request():
    # Before, a 2 KB chat body held render's whole answer uncharged: here 150 KB past a
    # 64 KiB budget, answered as if the door held nothing.
    app, fleet = door(max_held_bytes=64 * 1024)
    async with app_client(app) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "payload_too_large"
    assert fleet.generate_bodies == []


async def test_renders_answer_past_what_generate_takes_is_refused_as_it_arrives():
    app, fleet = door(max_body_bytes=100_000, follow_generate_body_cap=False)
    async with app_client(app) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 413, r.text
    assert "100000" in r.json()["error"]["message"]
    assert fleet.generate_bodies == []


async def test_once_generate_has_the_request_the_stream_holds_only_the_callers_request():
    app, fleet = door(max_held_bytes=1 << 20)
    body = msgspec.json.encode({**CHAT, "stream": True})
    async with app_client(app) as c:
        call = AsgiCall(
            app, "POST", "/v1/chat/completions", body, {"content-length": str(len(body))}
        )
        assert await call.status() == 200
        assert fleet.generate_bodies and fleet.generate_bodies[0] > 100_000
        # Mid-stream: render's answer and the copy sent on are given back; the body and the
        # document parsed from it (charged as much again) are what the answer is written from.
        assert await held(c) == 2 * len(body)
        fleet.go.set()
        await asyncio.wait_for(call.task, 10)
        assert await held(c) == 0


ITEM = 16 * 1024 * 1024


class ItemFleet(Fleet):
    """``Fleet`` whose render answers completions, each prompt with one ITEM-byte image item
    (decoded as a view into render's answer), and whose generate answers whole once ``go``
    is set (``asked`` is set when it has read a request)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

        async def render(request: Request) -> Response:
            features = MultiModalFeatures(
                mm_hashes={"image": ["h" * 16]},
                mm_placeholders={"image": [{"offset": 0, "length": 1}]},
                kwargs_data={"image": [bytes(ITEM)]},
            )
            rendered = GenerateRequest(
                token_ids=[1, 2], features=features, sampling_params={"max_tokens": 1}
            )
            return _rendered([rendered])

        app = Starlette(routes=[Route("/v1/completions/render", render, methods=["POST"])])
        self.render = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1" or request.method == "GET":
            return await super().handle_async_request(request)
        self.generate_bodies.append(sum([len(piece) async for piece in request.stream]))  # type: ignore[union-attr]
        headers = {"content-type": "application/json"}
        return httpx.Response(200, headers=headers, stream=_Stream(self._whole()))

    async def _whole(self) -> AsyncIterator[bytes]:
        """The whole answer's body, sent once ``go`` is set (``asked``: the door reads it)."""
        self.asked.set()
        await self.go.wait()
        choice = {"index": 0, "token_ids": [5], "finish_reason": "length"}
        yield msgspec.json.encode({"request_id": "x", "choices": [choice]})


async def test_a_whole_completion_keeps_none_of_renders_answer_while_it_generates():
    # Before, the rendered requests (their items views into render's answer) stayed named
    # until the whole answer was read and written: its charge was given back once generate
    # answered, its bytes were not.
    fleet = ItemFleet()
    app = create_app(
        settings(render_urls=("http://r1",), generate_urls=("http://g1",)), Texts(), fleet
    )
    body = msgspec.json.encode({"model": "m", "prompt": "hi"})
    tracemalloc.start()
    try:
        async with app_client(app) as c:
            call = AsgiCall(
                app, "POST", "/v1/completions", body, {"content-length": str(len(body))}
            )
            await asyncio.wait_for(fleet.asked.wait(), 10)  # generate answered; read now
            assert fleet.generate_bodies[0] > ITEM  # generate has the item
            assert await held(c) == 2 * len(body)  # render's answer no longer charged
            gc.collect()
            held_now, _ = tracemalloc.get_traced_memory()
            fleet.go.set()
            assert await call.status() == 200
    finally:
        tracemalloc.stop()
    assert held_now < ITEM // 2, held_now


class _Ledger:
    """A slot that records what it is charged and refuses past ``budget``, as a gate would."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held, self.peak = budget, 0, 0

    def take(self, nbytes: int) -> None:
        if self.held + nbytes > self.budget:
            raise PayloadTooLarge(f"{nbytes} more do not fit")
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def give_back(self, nbytes: int) -> None:
        self.held -= nbytes


def _pieces_answer(pieces: list[bytes]) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    request = httpx.Request("POST", "http://r1/v1/chat/completions/render")
    return httpx.Response(200, stream=_Stream(body()), request=request)


async def test_the_joined_copy_of_an_answer_in_pieces_is_charged_while_both_are_held():
    # The pieces and the copy they are joined into exist together for a moment: the door
    # reached +123 MiB against a 100 MiB budget with the copy uncharged.
    pieces = [bytes([i]) * 1000 for i in range(4)]
    ledger = _Ledger(budget=8000)
    assert await _read_capped(_pieces_answer(pieces), None, ledger) == b"".join(pieces)
    assert (ledger.peak, ledger.held) == (8000, 4000)  # both, then the copy alone
    with pytest.raises(PayloadTooLarge):  # no room for the copy: refused before it is made
        await _read_capped(_pieces_answer(pieces), None, _Ledger(budget=7999))
