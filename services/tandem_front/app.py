"""The front door's HTTP face: pass-through routes, the OpenAI routes, health and control."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_client.routing import ROUTE_KEY_HEADER
from tandem_http import (
    api_keys,
    mark_process_dead,
    metrics_response,
    models_response,
    read_body,
    read_raw_body,
    service_app,
)
from tandem_http.openapi import BodySchemas, install_openapi
from tandem_wire import WireFormat, body_coding, decode_body, format_of_content_type

from .affinity import request_id_of_body, routing_key
from .control import CONTROL_ROUTES, ControlRoute, fan_out
from .errors import ControlRoutesDisabled, UpstreamError, UpstreamUnavailable
from .metrics import FrontMetrics
from .openai_service import OpenAIService, Texts
from .proxy import Forwarder, OnceStream, upstream_headers
from .schemas import upstream_body_schemas
from .settings import SETTINGS_ENV, FrontSettings
from .trl_compat import HEADER as LOGPROBS_FORMAT_HEADER
from .trl_compat import TRL_REQUEST_PREFIX, with_token_strings
from .upstreams import Upstreams

__all__ = ["create_app", "app_from_env"]

RENDER_ROUTES = ("/v1/chat/completions/render", "/v1/completions/render")
GENERATE_PATH = "/inference/v1/generate"


def create_app(
    settings: FrontSettings,
    texts: Texts | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Build the app. Without ``texts``, the tokenizer-backed detokenizer (vLLM's) is built at
    start-up; ``transport`` replaces the network for in-process tests."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = FrontMetrics.create(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upstreams = Upstreams(settings, transport)
        forwarder = Forwarder(upstreams, metrics)
        text_side = texts
        if text_side is None:
            from .vllm_texts import VllmTexts

            text_side = VllmTexts(settings)
        app.state.upstreams = upstreams
        app.state.forwarder = forwarder
        app.state.openai = OpenAIService(settings, upstreams, forwarder, text_side)
        try:
            yield
        finally:
            await upstreams.aclose()
            mark_process_dead(os.getpid())

    app = service_app("Tandem front door", lifespan, settings.api_key)

    def forwarder(request: Request) -> Forwarder:
        return request.app.state.forwarder  # type: ignore[no-any-return]

    def openai(request: Request) -> OpenAIService:
        return request.app.state.openai  # type: ignore[no-any-return]

    async def render_route(request: Request) -> Response:
        fwd = forwarder(request)
        body = OnceStream(request.stream())
        return await fwd.forward(fwd.upstreams.render_order(), request, request.url.path, body)

    for path in RENDER_ROUTES:
        app.add_api_route(path, render_route, methods=["POST"])

    @app.post(GENERATE_PATH)
    async def generate(request: Request) -> Response:
        # The body is read whole (capped), then sent on byte for byte, compressed or not.
        # tandem_client names the routing key in a header (its repeats carry content ids, not
        # render's hashes); for other callers it is read from the body (decoded, capped).
        coding = body_coding(request.headers.get("content-encoding"))
        body = await read_raw_body(request, settings.max_body_bytes)
        fmt = format_of_content_type(request.headers.get("content-type"))
        fwd = forwarder(request)

        @functools.cache
        def plain() -> bytes:
            return decode_body(body, coding, settings.max_body_bytes)

        key = request.headers.get(ROUTE_KEY_HEADER) or routing_key(plain(), fmt)
        nodes = fwd.upstreams.generate_order(key)
        if not _trl_shape(settings, request, plain, fmt):
            return await fwd.forward(nodes, request, GENERATE_PATH, body)
        headers = upstream_headers(request, len(body))
        headers["accept"] = "application/json"
        node, response = await fwd.open(nodes, "POST", GENERATE_PATH, headers, body)
        try:
            raw = await response.aread()
        finally:
            await fwd.close(node, response)
        ctype = response.headers.get("content-type", "")
        if response.status_code != 200 or "json" not in ctype:
            return Response(raw, response.status_code, media_type=ctype or None)
        try:
            document = json.loads(raw)
        except ValueError:
            raise UpstreamError(f"{node.url} answered unreadable JSON") from None
        return JSONResponse(with_token_strings(document))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await read_body(request, settings.max_body_bytes)
        return await openai(request).chat(body, request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request, settings.max_body_bytes)
        return await openai(request).completions(body, request)

    @app.get("/health")
    async def health(request: Request) -> Response:
        ups = forwarder(request).upstreams
        render_ok = await ups.healthy(ups.render)
        generate_ok = await ups.healthy(ups.generate)
        missing = [t for t, ok in (("render", render_ok), ("generate", generate_ok)) if not ok]
        if missing:
            raise UpstreamUnavailable(
                f"no healthy {' or '.join(missing)} node", details={"missing": missing}
            )
        return JSONResponse(
            {"status": "ok", "render": len(render_ok), "generate": len(generate_ok)}
        )

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return models_response(settings.names(), await openai(request).max_model_len())

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return metrics_response(registry)

    keyed = bool(api_keys(settings.api_key))

    def control_handler(path: str, route: ControlRoute) -> Any:
        async def handler(request: Request) -> Response:
            if route.changes_state and not (keyed or settings.enable_control_routes):
                raise ControlRoutesDisabled(
                    f"{path} changes engine state: start the front door with --api-key or "
                    "--enable-control-routes to serve it"
                )
            body = await read_body(request, settings.max_body_bytes)
            ups = forwarder(request).upstreams
            headers = upstream_headers(request, len(body))
            headers.pop("content-encoding", None)  # the body goes on decoded
            status, answer = await fan_out(
                ups, route, path, request.url.query, headers, body, ups.generate
            )
            return JSONResponse(answer, status_code=status)

        return handler

    for path, route in CONTROL_ROUTES.items():
        app.add_api_route(path, control_handler(path, route), methods=[route.method])

    async def schemas(request: Request) -> BodySchemas:
        generate_paths = [
            GENERATE_PATH,
            *(p for p, r in CONTROL_ROUTES.items() if r.method == "POST"),
        ]
        return await upstream_body_schemas(
            forwarder(request).upstreams, RENDER_ROUTES, generate_paths
        )

    install_openapi(app, schemas)
    return app


def _trl_shape(
    settings: FrontSettings, request: Request, body: Callable[[], bytes], fmt: WireFormat
) -> bool:
    """Whether this generate answer gets TRL's logprob shape (see ``logprobs_format``)."""
    mode = request.headers.get(LOGPROBS_FORMAT_HEADER) or settings.logprobs_format
    if mode == "auto":
        rid = request_id_of_body(body(), fmt)
        return rid is not None and rid.startswith(TRL_REQUEST_PREFIX)
    return mode == "trl"


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes: settings come from ``TANDEM_FRONT_SETTINGS``."""
    return create_app(FrontSettings.from_json(os.environ[SETTINGS_ENV]))
