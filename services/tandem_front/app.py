"""The front door's HTTP face: pass-through routes, the OpenAI routes, health and control."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_client.discovery import Resolve
from tandem_client.routing import ROUTE_KEY_HEADER
from tandem_http import (
    CONTROL_BODY_BYTES,
    AdmissionGate,
    BodyDeadline,
    ControlAccess,
    SendDeadline,
    add_server_info_routes,
    admitted,
    body_chunks,
    held_bytes_budget,
    mark_process_dead,
    metrics_response,
    models_response,
    read_body,
    read_raw_body,
    service_app,
    slot_of,
)
from tandem_http.admission import declared_length
from tandem_http.openapi import BodySchemas, install_openapi
from tandem_wire import body_coding, format_of_content_type
from tandem_wire.control import CONTROL_ROUTES, ControlRoute

from .affinity import generate_route
from .control import relay
from .discovery import NodeWatch
from .errors import UpstreamError, UpstreamUnavailable
from .inline_render import render_mounts
from .metrics import FrontMetrics
from .openai_service import Answers, OpenAIService
from .proxy import (
    ClientGone,
    Forwarder,
    OnceStream,
    unless_gone,
    upstream_headers,
    with_upstream_headers,
)
from .schemas import upstream_body_schemas
from .settings import SETTINGS_ENV, FrontSettings
from .trl_compat import HEADER as LOGPROBS_FORMAT_HEADER
from .trl_compat import TRL_REQUEST_PREFIX, with_token_strings
from .upstreams import Node, Upstreams

__all__ = ["create_app", "app_from_env"]

RENDER_ROUTES = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/tokenize",
    "/detokenize",
)
"""Render's routes, passed through as they are (``vllm serve`` answers the tokenizer routes
with the same renderer render runs)."""
GENERATE_PATH = "/inference/v1/generate"


def create_app(
    settings: FrontSettings,
    answers: Answers | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    resolve: Resolve | None = None,
) -> FastAPI:
    """Build the app. Without ``answers``, the tokenizer-backed answer side (vLLM's) is built
    at start-up; ``transport`` replaces the network and ``resolve`` DNS for in-process tests."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = FrontMetrics.create(registry)
    gate = AdmissionGate(
        settings.max_pending,
        "tandem_front",
        registry,
        max_bytes=held_bytes_budget(settings.max_held_bytes, settings.workers),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with render_mounts(settings.inline_render) as mounts, _serving(app, mounts):
            yield

    @asynccontextmanager
    async def _serving(
        app: FastAPI, mounts: dict[str, httpx.AsyncBaseTransport]
    ) -> AsyncIterator[None]:
        upstreams = Upstreams(settings, transport, metrics, mounts)
        watch = NodeWatch(upstreams, resolve)
        watching = None
        if watch.dynamic:
            await watch.refresh()  # the first requests find the discovered nodes
            watching = asyncio.create_task(watch.run())
        app.state.node_watch = watch
        await upstreams.start()  # serves nothing before each node told or timed out
        forwarder = Forwarder(upstreams, metrics)
        answer_side = answers
        if answer_side is None:
            from .vllm_answers import VllmAnswers

            answer_side = VllmAnswers(settings)
        app.state.upstreams = upstreams
        app.state.forwarder = forwarder
        app.state.openai = OpenAIService(settings, upstreams, forwarder, answer_side, gate)
        try:
            yield
        finally:
            if watching is not None:
                watching.cancel()
            await upstreams.aclose()
            mark_process_dead(os.getpid())

    app = service_app(
        "Tandem front door",
        lifespan,
        settings.api_key,
        settings.admin_api_key,
        BodyDeadline.of(settings.body_timeout_s, settings.body_min_rate),
        send_deadline=SendDeadline.of(settings.send_timeout_s, settings.send_min_rate),
    )
    app.add_exception_handler(ClientGone, _client_gone)

    def forwarder(request: Request) -> Forwarder:
        return request.app.state.forwarder  # type: ignore[no-any-return]

    def openai(request: Request) -> OpenAIService:
        return request.app.state.openai  # type: ignore[no-any-return]

    @admitted(gate)
    async def render_route(request: Request) -> Response:
        fwd = forwarder(request)
        body = OnceStream(body_chunks(request, settings.render_max_body_bytes))
        return await fwd.forward(fwd.upstreams.render_order(), request, request.url.path, body)

    for path in RENDER_ROUTES:
        app.add_api_route(path, render_route, methods=["POST"])

    @app.post(GENERATE_PATH)
    @admitted(gate)
    async def generate(request: Request) -> Response:
        # The body is read whole (capped), then sent on byte for byte, compressed or not.
        # tandem_client names the routing key in a header, and then the body is not decoded
        # here at all: the node judges it.
        # For other callers the key is read from the body (decoded off the loop, capped).
        coding = body_coding(request.headers.get("content-encoding"))
        fwd = forwarder(request)
        cap = await fwd.upstreams.generate_body_cap(declared_length(request))
        body = await read_raw_body(request, cap)
        fmt = format_of_content_type(request.headers.get("content-type"))
        key, request_id = await generate_route(
            request.headers.get(ROUTE_KEY_HEADER), body, coding, fmt, cap, slot_of(request)
        )
        nodes = fwd.upstreams.generate_order(key)
        if not _trl_shape(settings, request, request_id):
            return await fwd.forward(nodes, request, GENERATE_PATH, body)
        headers = upstream_headers(request, len(body))
        headers["accept"] = "application/json"
        return await unless_gone(request, _trl_answer(fwd, nodes, headers, body))

    @app.post("/v1/chat/completions")
    @admitted(gate)
    async def chat(request: Request) -> Response:
        body = await read_body(request, settings.render_max_body_bytes)
        return await unless_gone(request, openai(request).chat(body, request))

    @app.post("/v1/completions")
    @admitted(gate)
    async def completions(request: Request) -> Response:
        body = await read_body(request, settings.render_max_body_bytes)
        return await unless_gone(request, openai(request).completions(body, request))

    @app.post("/v1/messages")
    @admitted(gate)
    async def messages(request: Request) -> Response:
        body = await read_body(request, settings.render_max_body_bytes)
        return await unless_gone(request, openai(request).messages(body, request))

    @app.post("/v1/responses")
    @admitted(gate)
    async def create_response(request: Request) -> Response:
        body = await read_body(request, settings.render_max_body_bytes)
        return await unless_gone(request, openai(request).responses(body, request))

    @app.get("/v1/responses/{response_id}")
    @admitted(gate)
    async def retrieve_response(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        return await openai(request).retrieve_response(response_id, request)

    @app.post("/v1/responses/{response_id}/cancel")
    @admitted(gate)
    async def cancel_response(request: Request) -> Response:
        return await openai(request).cancel_response(request.path_params["response_id"], request)

    @app.post("/v1/messages/count_tokens")
    @admitted(gate)
    async def count_tokens(request: Request) -> Response:
        body = await read_body(request, settings.render_max_body_bytes)
        return await unless_gone(request, openai(request).count_tokens(body, request))

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

    add_server_info_routes(app, gate, health, lambda r: openai(r).answers.vllm_version)

    @app.get("/metrics")
    async def metrics_route(request: Request) -> Response:
        ups = forwarder(request).upstreams
        live = {n.url for n in (*ups.render, *ups.generate)}
        # Series of nodes no longer in the fleet are left out (another worker's files too).
        return metrics_response(
            registry, lambda labels: labels.get("node", "") in live or "node" not in labels
        )

    access = ControlAccess(settings.api_key, settings.admin_api_key, settings.enable_control_routes)
    admin_key = settings.upstream_admin_api_key

    def control_handler(route: ControlRoute) -> Any:
        path = route.path

        @admitted(gate)
        async def handler(request: Request) -> Response:
            if route.changes_state:
                access.check(request, path)  # before anything is read or sent on
            body = await read_body(request, CONTROL_BODY_BYTES)
            ups = forwarder(request).upstreams
            headers = upstream_headers(request, len(body))
            headers.pop("content-encoding", None)  # the body goes on decoded
            if route.changes_state and admin_key:
                # Only admins get here: the nodes are told so with the door's admin key.
                headers["authorization"] = f"Bearer {admin_key}"
            status, answer = await relay(ups, route, request.url.query, headers, body)
            return JSONResponse(answer, status_code=status)

        return handler

    for route in CONTROL_ROUTES:
        app.add_api_route(route.path, control_handler(route), methods=[route.method])

    async def schemas(request: Request) -> BodySchemas:
        generate_paths = [
            GENERATE_PATH,
            *(r.path for r in CONTROL_ROUTES if r.method == "POST"),
        ]
        return await upstream_body_schemas(
            forwarder(request).upstreams, RENDER_ROUTES, generate_paths
        )

    install_openapi(app, schemas)
    return app


async def _trl_answer(
    fwd: Forwarder, nodes: list[Node], headers: dict[str, str], body: bytes
) -> Response:
    """A generate answer read whole, its logprobs reshaped for TRL; refusals pass unchanged."""
    node, response = await fwd.open(nodes, "POST", GENERATE_PATH, headers, body)
    raw = await fwd.read(node, response)
    ctype = response.headers.get("content-type", "")
    if response.status_code != 200 or "json" not in ctype:
        passed = Response(raw, response.status_code, media_type=ctype or None)
        return with_upstream_headers(passed, response)
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError):
        raise UpstreamError(f"{node.url} answered unreadable JSON") from None
    return with_upstream_headers(JSONResponse(with_token_strings(document)), response)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer: the caller hung up while it was prepared (see unless_gone).
    return Response(status_code=499)


def _trl_shape(settings: FrontSettings, request: Request, request_id: str | None) -> bool:
    """Whether this generate answer gets TRL's logprob shape (see ``logprobs_format``);
    ``request_id`` as ``generate_route`` read it (None: not read, not a TRL request)."""
    mode = request.headers.get(LOGPROBS_FORMAT_HEADER) or settings.logprobs_format
    if mode == "auto":
        return request_id is not None and request_id.startswith(TRL_REQUEST_PREFIX)
    return mode == "trl"


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes: settings come from ``TANDEM_FRONT_SETTINGS``."""
    return create_app(FrontSettings.from_json(os.environ[SETTINGS_ENV]))
