"""The FastAPI app every Tandem service starts from, and the answers they all give alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from .admission import AdmissionGate
from .auth import ApiKeyMiddleware
from .body import AcceptEncodingMiddleware, BodyDeadline, BodyDeadlineMiddleware
from .errors import install_error_handlers
from .memory import startup_objects_frozen
from .request_id import RequestIdMiddleware
from .send import SendDeadline, SendDeadlineMiddleware

__all__ = ["add_server_info_routes", "models_response", "service_app"]


def service_app(
    title: str,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
    api_key: str | Sequence[str] | None,
    admin_key: str | Sequence[str] | None = None,
    body_deadline: BodyDeadline | None = None,
    proxy_key: str | Sequence[str] | None = None,
    send_deadline: SendDeadline | None = None,
) -> FastAPI:
    """An app with the API-key check (``/health`` open; ``admin_key``: the keys that may also
    change engine state, see ``ControlAccess``; ``proxy_key``: the keys of front doors, whose
    ``TENANT_HEADER`` names their caller), request ids, the error handlers and
    ``Accept-Encoding: zstd`` on every answer (its routes read bodies with ``read_body``, which
    decodes them), every request body on ``body_deadline`` (408 ``body_timeout`` past it) and
    every answer on ``send_deadline`` (the connection cut past it).
    FastAPI's own schema route is off: its routes read raw wire bodies, so each service serves
    a document with their schemas filled in (``tandem_http.openapi``). While it serves, the
    objects its start-up left are frozen out of the cyclic garbage collector
    (``startup_objects_frozen``)."""

    @asynccontextmanager
    async def serving(app: FastAPI) -> AsyncIterator[None]:
        async with lifespan(app):
            with startup_objects_frozen():
                yield

    app = FastAPI(title=title, lifespan=serving, openapi_url=None)
    app.add_middleware(
        ApiKeyMiddleware,
        api_key=api_key,
        admin_key=admin_key,
        open_paths=("/health", "/ping"),
        proxy_key=proxy_key,
    )
    app.add_middleware(RequestIdMiddleware)
    # Outside the key check and the routes alike: whoever reads a body reads it on time.
    app.add_middleware(BodyDeadlineMiddleware, deadline=body_deadline)
    # Outermost: 401s and the error handlers' answers advertise it too.
    app.add_middleware(AcceptEncodingMiddleware)
    # Closest to the server: every answer's writes are timed, whoever sends them.
    app.add_middleware(SendDeadlineMiddleware, deadline=send_deadline)
    install_error_handlers(app)
    return app


def models_response(names: Iterable[str], max_model_len: int | None) -> JSONResponse:
    """``GET /v1/models`` as vLLM's OpenAI server answers it."""
    data: list[dict[str, Any]] = [
        {"id": n, "object": "model", "owned_by": "tandem", "max_model_len": max_model_len}
        for n in names
    ]
    return JSONResponse({"object": "list", "data": data})


def add_server_info_routes(
    app: FastAPI,
    gate: AdmissionGate,
    health: Callable[[Request], Awaitable[Response]],
    vllm_version: Callable[[Request], str],
) -> None:
    """``vllm serve``'s ``GET /version`` (the vLLM this service runs), ``GET /load`` (the
    requests this process holds now; ``vllm serve`` counts its own only with
    ``--enable-server-load-tracking`` and says 0 otherwise) and ``GET``/``POST /ping``
    (SageMaker's name for ``health``, open like it)."""

    async def version(request: Request) -> Response:
        return JSONResponse({"version": vllm_version(request)})

    async def load(request: Request) -> Response:
        return JSONResponse({"server_load": gate.current})

    app.add_api_route("/version", version, methods=["GET"])
    app.add_api_route("/load", load, methods=["GET"])
    app.add_api_route("/ping", health, methods=["GET", "POST"])
