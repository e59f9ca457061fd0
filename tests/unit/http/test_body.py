"""read_body limits and content codings, content negotiation, wire_response and PartsResponse."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import msgspec
import pytest
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from tandem_http import (
    AcceptEncodingMiddleware,
    PartsResponse,
    RequestIdMiddleware,
    install_error_handlers,
    negotiate,
    read_body,
    read_raw_body,
    wire_response,
)
from tandem_wire import compress_zstd

pytestmark = pytest.mark.anyio

LIMIT = 16
BIG_LIMIT = 64 * 1024
MSGPACK = "application/vnd.msgpack"


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        return Response(await read_body(request, LIMIT), media_type="application/octet-stream")

    @app.post("/echo-big")
    async def echo_big(request: Request) -> Response:
        body = await read_body(request, BIG_LIMIT)
        return Response(body, media_type="application/octet-stream")

    @app.post("/raw")
    async def raw(request: Request) -> Response:
        body = await read_raw_body(request, BIG_LIMIT)
        return Response(body, media_type="application/octet-stream")

    @app.post("/formats")
    async def formats(request: Request) -> Response:
        body_fmt, reply_fmt = negotiate(request)
        return wire_response({"body": body_fmt.name, "reply": reply_fmt.name}, reply_fmt)

    @app.get("/parts/{count}")
    async def parts(count: int) -> Response:
        return PartsResponse([b"", *(b"%d-" % i for i in range(count))], media_type="text/plain")

    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(AcceptEncodingMiddleware)
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


class Chunks:
    """A request body that counts how many of its chunks the app pulled."""

    def __init__(self, chunk: bytes, count: int) -> None:
        self.chunk = chunk
        self.count = count
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.pulled += 1
            yield self.chunk


async def test_under_limit_returns_bytes_intact() -> None:
    payload = bytes(range(LIMIT))
    async with client(make_app()) as c:
        r = await c.post("/echo", content=payload)
    assert r.status_code == 200
    assert r.content == payload


async def test_empty_body() -> None:
    async with client(make_app()) as c:
        r = await c.post("/echo")
    assert r.status_code == 200
    assert r.content == b""


async def test_declared_length_over_limit_is_refused_before_reading() -> None:
    body = Chunks(b"x" * 8, 10)
    async with client(make_app()) as c:
        r = await c.post("/echo", content=body, headers={"content-length": "80"})
    assert r.status_code == 413
    assert body.pulled == 0
    error = r.json()["error"]
    assert error["type"] == "payload_too_large"
    assert error["code"] == 413
    assert error["request_id"] == r.headers["x-request-id"]


async def test_chunked_body_over_limit_stops_reading() -> None:
    body = Chunks(b"x" * 8, 10)
    async with client(make_app()) as c:
        r = await c.post("/echo", content=body)
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "payload_too_large"
    # 8 + 8 is within the limit; the third chunk passes it and reading stops there.
    assert body.pulled == 3


async def test_chunked_body_at_limit_passes() -> None:
    body = Chunks(b"y" * 8, 2)
    async with client(make_app()) as c:
        r = await c.post("/echo", content=body)
    assert r.status_code == 200
    assert r.content == b"y" * LIMIT


@pytest.mark.parametrize(
    ("content_type", "accept", "expected"),
    [
        (None, None, ("JSON", "JSON")),
        ("application/json", "application/json", ("JSON", "JSON")),
        ("application/json; charset=utf-8", "*/*", ("JSON", "JSON")),
        (MSGPACK, MSGPACK, ("MSGPACK", "MSGPACK")),
        ("application/x-msgpack", "application/json, application/msgpack", ("MSGPACK", "MSGPACK")),
        (MSGPACK, None, ("MSGPACK", "JSON")),
        ("application/json", MSGPACK, ("JSON", "MSGPACK")),
    ],
)
async def test_negotiate(
    content_type: str | None, accept: str | None, expected: tuple[str, str]
) -> None:
    headers = {}
    if content_type is not None:
        headers["content-type"] = content_type
    if accept is not None:
        headers["accept"] = accept
    async with client(make_app()) as c:
        r = await c.post("/formats", content=b"{}", headers=headers)
    assert r.status_code == 200
    if expected[1] == "MSGPACK":
        assert r.headers["content-type"] == MSGPACK
        doc = msgspec.msgpack.decode(r.content)
    else:
        assert r.headers["content-type"] == "application/json"
        doc = msgspec.json.decode(r.content)
    assert (doc["body"], doc["reply"]) == expected


async def test_unknown_content_type_is_invalid_request() -> None:
    async with client(make_app()) as c:
        r = await c.post("/formats", content=b"hello", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request"


async def test_wire_response_status_and_headers() -> None:
    from tandem_wire import WireFormat

    response = wire_response([1, 2], WireFormat.MSGPACK, status_code=201, headers={"x-a": "b"})
    assert response.status_code == 201
    assert response.headers["x-a"] == "b"
    assert response.media_type == MSGPACK
    assert msgspec.msgpack.decode(bytes(response.body)) == [1, 2]


@pytest.mark.parametrize("count", [0, 1, 5])
async def test_parts_response_sends_every_piece_under_one_content_length(count: int) -> None:
    expected = b"".join(b"%d-" % i for i in range(count))
    async with client(make_app()) as c:
        r = await c.get(f"/parts/{count}")
    assert r.status_code == 200 and r.content == expected
    assert r.headers["content-length"] == str(len(expected))
    assert r.headers["content-type"].startswith("text/plain")
    assert "x-request-id" in r.headers


ZSTD_HEADERS = {"content-encoding": "zstd"}


async def test_a_zstd_body_is_read_decoded_and_every_answer_advertises_zstd() -> None:
    payload = bytes(range(256)) * 200  # 51,200 bytes, under the limit
    async with client(make_app()) as c:
        r = await c.post("/echo-big", content=compress_zstd(payload), headers=ZSTD_HEADERS)
        plain = await c.post("/echo-big", content=b"as is")
        missing = await c.get("/nowhere")
    assert r.status_code == 200 and r.content == payload
    assert plain.content == b"as is"
    for answer in (r, plain, missing):
        assert answer.headers["accept-encoding"] == "zstd"


async def test_read_raw_body_keeps_the_body_as_sent() -> None:
    frame = compress_zstd(b"q" * 40_000)
    async with client(make_app()) as c:
        r = await c.post("/raw", content=frame, headers=ZSTD_HEADERS)
    assert r.content == frame


async def test_a_zstd_bomb_is_413_and_the_service_keeps_serving() -> None:
    bomb = compress_zstd(bytes(64 * 1024 * 1024))  # 64 MiB of zeros in a few KiB
    assert len(bomb) < BIG_LIMIT
    async with client(make_app()) as c:
        r = await c.post("/echo-big", content=bomb, headers=ZSTD_HEADERS)
        after = await c.post("/echo-big", content=b"still here")
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["type"] == "payload_too_large" and str(BIG_LIMIT) in error["message"]
    assert after.content == b"still here"


async def test_a_decoded_body_over_the_limit_is_413_even_when_small_on_the_wire() -> None:
    payload = b"z" * (BIG_LIMIT + 1)
    async with client(make_app()) as c:
        r = await c.post("/echo-big", content=compress_zstd(payload), headers=ZSTD_HEADERS)
    assert r.status_code == 413


async def test_a_corrupt_zstd_body_is_malformed() -> None:
    async with client(make_app()) as c:
        r = await c.post("/echo-big", content=b"not zstd", headers=ZSTD_HEADERS)
    assert r.status_code == 400 and r.json()["error"]["type"] == "malformed_body"


async def test_an_unknown_coding_is_415_before_the_body_is_read() -> None:
    body = Chunks(b"x" * 8, 2)
    async with client(make_app()) as c:
        r = await c.post("/echo-big", content=body, headers={"content-encoding": "gzip"})
    assert r.status_code == 415
    assert r.json()["error"]["type"] == "unsupported_content_encoding"
    assert r.headers["accept-encoding"] == "zstd"  # what to send instead (RFC 7694)
    assert body.pulled == 0
