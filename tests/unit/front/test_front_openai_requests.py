"""What the door's OpenAI routes send on: the generate request carries render's sampling as
rendered (never rebuilt from the caller's body)."""

from __future__ import annotations

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
from tandem_wire import GenerateRequest
from tests.support.asgi import app_client

from .test_front_proxy_failures import CHAT, Texts, _rendered, _Stream, _token_event
from .test_front_routing import settings

pytestmark = pytest.mark.anyio

GENERATE = "/inference/v1/generate"

# What vLLM's to_sampling_params resolves from the bodies below on a model whose context has
# 10 tokens left and whose generation config adds stop token 99.
RENDERED = {"max_tokens": 10, "stop_token_ids": [7, 99], "temperature": 0.0, "n": 1}


def _render_app(sampling: dict[str, Any]) -> Starlette:
    async def render(request: Request) -> Response:
        rendered = GenerateRequest(token_ids=[1, 2], sampling_params=sampling)
        return _rendered([rendered], single=request.url.path.startswith("/v1/chat"))

    paths = ("/v1/chat/completions/render", "/v1/completions/render")
    return Starlette(routes=[Route(p, render, methods=["POST"]) for p in paths])


class Recorded(httpx.AsyncBaseTransport):
    """Render answers ``sampling``; generate records each request and answers one token."""

    def __init__(self, sampling: dict[str, Any]) -> None:
        self.render = httpx.ASGITransport(app=_render_app(sampling))
        self.generated: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            return await self.render.handle_async_request(request)
        if request.method == "GET":  # the door's weight-version poll: not part of this test
            return httpx.Response(404)
        gen = msgspec.msgpack.decode(await request.aread())
        self.generated.append(gen)
        if gen["stream"]:
            stream = _Stream(_one_token())
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
        choice = {"index": 0, "token_ids": [5], "finish_reason": "length"}
        return httpx.Response(200, json={"request_id": gen["request_id"], "choices": [choice]})


async def _one_token() -> AsyncIterator[bytes]:
    yield _token_event(5, "length")
    yield b"data: [DONE]\n\n"


ASKED = {"max_tokens": 100_000, "stop_token_ids": [7], "temperature": 0, "n": 1}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, **ASKED, "max_completion_tokens": 100_000}),
        ("/v1/completions", {"model": "m", "prompt": "hi", **ASKED}),
    ],
    ids=["chat", "completions"],
)
async def test_generate_gets_renders_sampling_as_rendered(path, body, stream):
    t = Recorded(RENDERED)
    app = create_app(settings(render_urls=("http://r1",), generate_urls=("http://g1",)), Texts(), t)
    async with app_client(app) as c:
        r = await c.post(path, json={**body, "stream": stream})
    assert r.status_code == 200
    # Before, the caller's max_tokens (past the room left) and stop_token_ids (without the
    # model's own) were written back over render's.
    assert [g["sampling_params"] for g in t.generated] == [RENDERED]


async def test_a_streamed_answer_is_read_to_its_end_so_its_connection_is_kept():
    # httpx gives a connection back to its pool only from an answer read to its end; the
    # door stopped at [DONE], before the body's last chunk, and paid a new connection for
    # every streamed request.
    ended: list[bool] = []

    async def done_then_end() -> AsyncIterator[bytes]:
        yield _token_event(5, "length")
        yield b"data: [DONE]\n\n"
        ended.append(True)  # runs only when the reader asks for more after [DONE]
        yield b""

    class Streams(Recorded):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.host == "g1" and request.method == "POST":
                await request.aread()
                stream = _Stream(done_then_end())
                return httpx.Response(
                    200, headers={"content-type": "text/event-stream"}, stream=stream
                )
            return await super().handle_async_request(request)

    t = Streams(RENDERED)
    app = create_app(settings(render_urls=("http://r1",), generate_urls=("http://g1",)), Texts(), t)
    async with app_client(app) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert ended == [True]
