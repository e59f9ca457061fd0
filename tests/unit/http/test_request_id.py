"""RequestIdMiddleware: sane incoming ids are kept, anything else is replaced."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI
from starlette.requests import Request

from tandem_http import RequestIdMiddleware, install_error_handlers, request_id_of

pytestmark = pytest.mark.anyio

HEX_ID = re.compile(r"[0-9a-f]{32}")


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/id")
    async def show_id(request: Request) -> dict[str, str]:
        return {"state": request.state.request_id, "helper": request_id_of(request)}

    app.add_middleware(RequestIdMiddleware)
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.parametrize("rid", ["abc", "A-b_c.d:e", "x" * 128, "0123456789abcdef" * 2])
async def test_sane_id_is_echoed(rid: str) -> None:
    async with client(make_app()) as c:
        r = await c.get("/id", headers={"x-request-id": rid})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == rid
    assert r.json() == {"state": rid, "helper": rid}


@pytest.mark.parametrize(
    "rid",
    [b"x" * 129, b"y" * 1000, b"has space", b"new\nline", b"", b"semi;colon", "\xfc".encode()],
    ids=["129", "1000", "space", "newline", "empty", "semicolon", "latin1"],
)
async def test_insane_id_is_replaced(rid: bytes) -> None:
    async with client(make_app()) as c:
        r = await c.get("/id", headers=[(b"x-request-id", rid)])
    assert r.status_code == 200
    new = r.headers["x-request-id"]
    assert HEX_ID.fullmatch(new)
    assert r.json() == {"state": new, "helper": new}


async def test_fresh_id_per_request() -> None:
    async with client(make_app()) as c:
        first = await c.get("/id")
        second = await c.get("/id")
    assert HEX_ID.fullmatch(first.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_id_on_error_responses() -> None:
    async with client(make_app()) as c:
        given = await c.get("/missing", headers={"x-request-id": "err-1"})
        made = await c.get("/missing")
    assert given.status_code == made.status_code == 404
    assert given.headers["x-request-id"] == "err-1"
    assert given.json()["error"]["request_id"] == "err-1"
    assert made.json()["error"]["request_id"] == made.headers["x-request-id"]
    # Exactly one header, even though the error handler also sets it.
    assert len(given.headers.get_list("x-request-id")) == 1
