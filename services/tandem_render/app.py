"""The render service's HTTP face: thin routes (decode -> call -> encode) over RenderService."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_http import (
    AdmissionGate,
    BodyDeadline,
    PartsResponse,
    SendDeadline,
    add_server_info_routes,
    admitted,
    held_bytes_budget,
    keep_freed_memory,
    mark_process_dead,
    metrics_response,
    models_response,
    negotiate,
    pretouch,
    read_body,
    service_app,
    slot_of,
)
from tandem_http.openapi import BodySchemas, install_openapi
from tandem_wire import (
    BODY_CODING_HEADER,
    MIN_COMPRESSED_BYTES,
    WIRE_TRANSFORMS_HEADER,
    ZSTD,
    WireFormat,
    accepted_wire_transforms,
    accepts_coding,
    compress_zstd,
    encode_generate_request_parts,
)

from .media import MediaLoader
from .metrics import RenderMetrics
from .service import Renderer, RenderService
from .settings import SETTINGS_ENV, RenderSettings

__all__ = ["create_app", "app_from_env"]

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions/render"
COMPLETION_PATH = "/v1/completions/render"
RESPONSES_PATH = "/v1/responses/render"
MESSAGES_PATH = "/v1/messages/render"
CHAT_DERENDER_PATH = "/v1/chat/completions/derender"
COMPLETION_DERENDER_PATH = "/v1/completions/derender"
PATHS = {
    "chat": CHAT_PATH,
    "completion": COMPLETION_PATH,
    "responses": RESPONSES_PATH,
    "messages": MESSAGES_PATH,
    "chat_derender": CHAT_DERENDER_PATH,
    "completion_derender": COMPLETION_DERENDER_PATH,
    "tokenize": "/tokenize",
    "detokenize": "/detokenize",
}
"""Every route `vllm launch render` serves with a body, by kind, at upstream's paths."""


def create_app(settings: RenderSettings, renderer: Renderer | None = None) -> FastAPI:
    """Build the app. Without ``renderer``, vLLM's render stack is built at start-up (lifespan),
    so a process that only imports this module does no work."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = RenderMetrics.create(registry)
    gate = AdmissionGate(
        settings.max_pending,
        "tandem_render",
        registry,
        max_bytes=held_bytes_budget(settings.max_held_bytes, settings.workers),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine_renderer = renderer
        if engine_renderer is None:
            from .vllm_renderer import EngineRenderer

            engine_renderer = EngineRenderer(settings)
        if settings.pretouch_cache_memory:
            prepare_worker_memory(settings)
        loader = MediaLoader(settings.media_policy())
        app.state.service = RenderService(settings, engine_renderer, loader, metrics)
        try:
            yield
        finally:
            await loader.aclose()
            mark_process_dead(os.getpid())  # this worker's live gauges stop counting

    app = service_app(
        "Tandem render",
        lifespan,
        settings.api_key,
        body_deadline=BodyDeadline.of(settings.body_timeout_s, settings.body_min_rate),
        send_deadline=SendDeadline.of(settings.send_timeout_s, settings.send_min_rate),
    )

    async def request_body(request: Request) -> tuple[bytes, Any, Any, frozenset[str], bool]:
        body = await read_body(request, settings.max_body_bytes)
        in_fmt, out_fmt = negotiate(request)
        # Wire transforms only in binary answers: a JSON answer stays upstream's bytes.
        transforms = (
            accepted_wire_transforms(request.headers.get(WIRE_TRANSFORMS_HEADER))
            if out_fmt is WireFormat.MSGPACK
            else frozenset()
        )
        coded = accepts_coding(request.headers.get(BODY_CODING_HEADER), ZSTD)
        return body, in_fmt, out_fmt, transforms, coded

    def respond(answer: Any, out_fmt: WireFormat, request: Request) -> Response:
        parts = encode_generate_request_parts(answer, out_fmt)
        headers = {}
        if out_fmt is WireFormat.MSGPACK and settings.answer_zstd_level > 0:
            headers["vary"] = "accept-encoding"
            if (
                accepts_coding(request.headers.get("accept-encoding"), ZSTD)
                and sum(map(len, parts)) >= MIN_COMPRESSED_BYTES
            ):
                parts = [compress_zstd(parts, settings.answer_zstd_level)]
                headers["content-encoding"] = ZSTD
        response = PartsResponse(parts, media_type=out_fmt.content_type, headers=headers)
        metrics.bytes_out.labels(out_fmt.name.lower()).inc(response.length)
        return response

    def render_route(kind: str) -> None:
        @app.post(PATHS[kind], name=f"render_{kind}")
        @admitted(gate)
        async def route(request: Request) -> Response:
            body, in_fmt, out_fmt, transforms, coded = await request_body(request)
            render = getattr(request.app.state.service, f"render_{kind}")
            answer = await render(body, in_fmt, transforms, coded, slot_of(request))
            return respond(answer, out_fmt, request)

    # Derender answers are upstream's JSON whatever the caller accepts: they are small text.
    def derender_route(kind: str) -> None:
        @app.post(PATHS[f"{kind}_derender"], name=f"derender_{kind}")
        @admitted(gate)
        async def route(request: Request) -> Response:
            body = await read_body(request, settings.max_body_bytes)
            in_fmt, _ = negotiate(request)
            return JSONResponse(await request.app.state.service.derender(kind, body, in_fmt))

    for kind in ("chat", "completion", "responses", "messages"):
        render_route(kind)
    for kind in ("chat", "completion"):
        derender_route(kind)

    @app.get("/health")
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return models_response(settings.names(), request.app.state.service.renderer.max_model_len)

    add_server_info_routes(app, gate, health, lambda r: r.app.state.service.renderer.vllm_version)

    # `vllm launch render`'s tokenizer routes: upstream's JSON answers.
    @app.post(PATHS["tokenize"])
    @admitted(gate)
    async def tokenize(request: Request) -> Response:
        body = await read_body(request, settings.max_body_bytes)
        in_fmt, _ = negotiate(request)
        service = request.app.state.service
        return JSONResponse(await service.tokenize(body, in_fmt, slot_of(request)))

    @app.post(PATHS["detokenize"])
    @admitted(gate)
    async def detokenize(request: Request) -> Response:
        body = await read_body(request, settings.max_body_bytes)
        in_fmt, _ = negotiate(request)
        return JSONResponse(await request.app.state.service.detokenize(body, in_fmt))

    @app.get("/metrics")
    async def metrics_route() -> Response:
        # Every worker's values (from their files) in multiprocess mode, else this app's.
        return metrics_response(registry)

    async def schemas(request: Request) -> BodySchemas:
        from .vllm_renderer import body_schemas

        return body_schemas(PATHS)

    install_openapi(app, schemas)
    return app


def prepare_worker_memory(settings: RenderSettings) -> None:
    """Keep freed memory in this worker and fault in what its caches will hold."""
    if not keep_freed_memory():
        log.info("not glibc: freed memory is left to the C library's defaults")
        return
    seconds = pretouch(settings.cache_budget_bytes())
    log.info(
        "pre-faulted %d MiB of cache memory in %.2f s", settings.cache_budget_bytes() >> 20, seconds
    )


def app_from_env() -> FastAPI:
    """uvicorn factory for worker processes: settings come from ``TANDEM_RENDER_SETTINGS``."""
    return create_app(RenderSettings.from_json(os.environ[SETTINGS_ENV]))
