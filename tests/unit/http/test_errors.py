"""install_error_handlers: one body shape for service errors, wire errors, routing and bugs."""

from __future__ import annotations

import logging

import httpx
import msgspec
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from tandem_http import RequestIdMiddleware, install_error_handlers
from tandem_wire import MalformedBody, TandemHTTPError

pytestmark = pytest.mark.anyio

MSGPACK = "application/vnd.msgpack"


class ServiceError(TandemHTTPError):
    type = "service_error"


class CacheMiss(ServiceError):
    status_code = 409
    type = "mm_cache_miss"


class Overloaded(ServiceError):
    status_code = 429
    type = "overloaded"
    retry_after = 1


class Item(BaseModel):
    n: int


MISSING = {"image": ["ab" * 32]}


def make_app(*, request_ids: bool = True) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/miss")
    async def miss() -> None:
        raise CacheMiss("2 items are not cached", details={"missing": MISSING})

    @app.get("/param")
    async def param() -> None:
        raise ServiceError("bad temperature", param="sampling_params.temperature")

    @app.get("/busy")
    async def busy() -> None:
        raise Overloaded("too many requests waiting")

    @app.get("/malformed")
    async def malformed() -> None:
        raise MalformedBody("body is not valid JSON")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret")

    @app.post("/items")
    async def items(item: Item) -> dict[str, int]:
        return {"n": item.n}

    if request_ids:
        app.add_middleware(RequestIdMiddleware)
    return app


def client(app: FastAPI, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


async def test_service_error_renders_exact_json_body() -> None:
    async with client(make_app()) as c:
        r = await c.get("/miss", headers={"x-request-id": "req-1"})
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == "req-1"
    assert r.json() == {
        "error": {
            "type": "mm_cache_miss",
            "message": "2 items are not cached",
            "code": 409,
            "request_id": "req-1",
            "details": {"missing": MISSING},
        }
    }


async def test_service_error_in_msgpack_when_accepted() -> None:
    async with client(make_app()) as c:
        as_json = await c.get("/miss", headers={"x-request-id": "req-2"})
        r = await c.get("/miss", headers={"x-request-id": "req-2", "accept": MSGPACK})
    assert r.status_code == 409
    assert r.headers["content-type"] == MSGPACK
    assert msgspec.msgpack.decode(r.content) == as_json.json()


async def test_param_is_rendered() -> None:
    async with client(make_app()) as c:
        r = await c.get("/param")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "sampling_params.temperature"
    assert "details" not in r.json()["error"]


async def test_retry_after_on_overload() -> None:
    async with client(make_app()) as c:
        r = await c.get("/busy")
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "overloaded"


async def test_wire_error_is_handled_without_registering_it() -> None:
    async with client(make_app()) as c:
        r = await c.get("/malformed")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "malformed_body"
    assert error["message"] == "body is not valid JSON"
    assert error["request_id"] == r.headers["x-request-id"]


async def test_unexpected_error_is_a_generic_500(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="tandem")
    async with client(make_app(), raise_app_exceptions=False) as c:
        r = await c.get("/boom", headers={"x-request-id": "req-500"})
    assert r.status_code == 500
    assert b"secret" not in r.content
    assert r.headers["x-request-id"] == "req-500"
    error = r.json()["error"]
    assert error["type"] == "internal_error"
    assert error["code"] == 500
    assert "req-500" in error["message"]
    logged = [rec for rec in caplog.records if rec.name == "tandem"]
    assert logged and "req-500" in logged[0].getMessage()
    assert logged[0].exc_info is not None and "secret" in str(logged[0].exc_info[1])


async def test_unknown_route_is_not_found() -> None:
    async with client(make_app()) as c:
        r = await c.get("/nowhere", headers={"accept": MSGPACK})
    assert r.status_code == 404
    error = msgspec.msgpack.decode(r.content)["error"]
    assert error["type"] == "not_found"
    assert error["request_id"] == r.headers["x-request-id"]


async def test_wrong_method_is_method_not_allowed() -> None:
    async with client(make_app()) as c:
        r = await c.delete("/miss")
    assert r.status_code == 405
    assert r.json()["error"]["type"] == "method_not_allowed"


@pytest.mark.parametrize(
    "content",
    [b'{"n": "SECRETINPUT"}', b'{"m": 1}', b'{"n": ', b"[SECRETINPUT"],
    ids=["wrong-type", "missing", "truncated", "not-json"],
)
async def test_validation_error_is_invalid_request(content: bytes) -> None:
    async with client(make_app()) as c:
        r = await c.post("/items", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert b"SECRETINPUT" not in r.content
    error = r.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["code"] == 400
    assert len(error["message"]) < 300


async def test_validation_error_names_the_field() -> None:
    async with client(make_app()) as c:
        r = await c.post("/items", json={"n": "x"})
    assert r.json()["error"]["param"] == "n"


async def test_request_id_without_the_middleware() -> None:
    async with client(make_app(request_ids=False)) as c:
        r = await c.get("/miss")
    assert r.status_code == 409
    assert r.json()["error"]["request_id"] == r.headers["x-request-id"]
