"""/openapi.json: raw-body routes get their wire schemas, and a schema fuzzer reaches through it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import msgspec
import pytest
import schemathesis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tandem_http import read_body, service_app
from tandem_http.openapi import BodySchemas, install_openapi
from tandem_wire import WireFormat, decode_document


class Order(msgspec.Struct, forbid_unknown_fields=True):
    qty: Annotated[int, msgspec.Meta(ge=0)]
    note: Annotated[str, msgspec.Meta(max_length=8)] = ""


def toy_app(*, planted_bug: bool) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield

    app = service_app("toy", lifespan, None)

    @app.post("/orders")
    async def orders(request: Request) -> Response:
        order = decode_document(await read_body(request, 1 << 16), Order, WireFormat.JSON)
        if planted_bug and order.qty > 1000:
            raise RuntimeError("an unchecked path")  # the catch-all answers 500
        return JSONResponse({"qty": order.qty})

    async def schemas(request: Request) -> BodySchemas:
        return BodySchemas.of_structs({"/orders": Order})

    install_openapi(app, schemas)
    return app


def _document(app: FastAPI) -> dict[str, Any]:
    return schemathesis.openapi.from_asgi("/openapi.json", app).raw_schema  # type: ignore[no-any-return]


def test_raw_body_route_gets_its_schema_and_typed_errors() -> None:
    doc = _document(toy_app(planted_bug=False))
    assert doc["openapi"] == "3.1.0"
    op = doc["paths"]["/orders"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    order = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert order["properties"]["qty"] == {"type": "integer", "minimum": 0}
    error_ref = op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
    assert error_ref.rsplit("/", 1)[1] in doc["components"]["schemas"]
    # The schema route itself is not an operation of the API.
    assert "/openapi.json" not in doc["paths"]


def _fuzz(app: FastAPI, examples: int) -> None:
    op = schemathesis.openapi.from_asgi("/openapi.json", app)["/orders"]["POST"]

    @given(case=op.as_strategy())
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        case.call_and_validate(checks=[not_a_server_error])

    run()


def test_fuzzer_finds_a_planted_server_error_through_the_schema() -> None:
    _fuzz(toy_app(planted_bug=False), 50)
    with pytest.raises(Exception) as found:
        _fuzz(toy_app(planted_bug=True), 150)
    # Schemathesis reports the 500 ("Server error"), or Starlette's test client re-raises the
    # exception behind it; Hypothesis may group several distinct failures.
    assert any("Server error" in m or "an unchecked path" in m for m in _messages(found.value))


def _messages(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [m for sub in exc.exceptions for m in _messages(sub)]
    return [str(exc)]


def test_schema_name_clash_is_refused() -> None:
    a = BodySchemas(components={"X": {"type": "integer"}})
    with pytest.raises(ValueError, match="two different schemas"):
        a.merged(BodySchemas(components={"X": {"type": "string"}}))


def test_prefixed_renames_definitions_and_their_references() -> None:
    schemas = BodySchemas.of_structs({"/orders": list[Order]}).prefixed("shop.")
    assert list(schemas.components) == ["shop.Order"]
    assert schemas.bodies["/orders"]["items"] == {"$ref": "#/components/schemas/shop.Order"}
