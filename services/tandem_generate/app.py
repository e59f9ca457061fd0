"""The generate service's HTTP face: thin routes (decode -> call -> encode) over GenerateService."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from tandem_http import (
    AdmissionGate,
    ApiKeyMiddleware,
    HeldStreamingResponse,
    RequestIdMiddleware,
    admitted,
    install_error_handlers,
    keep_freed_memory,
    metrics_response,
    negotiate,
    pretouch,
    principal_of,
    read_body,
    wire_response,
)
from tandem_wire import decode_generate_request

from .engine import Engine
from .errors import EngineNotReady
from .metrics import GenerateMetrics
from .serving import GenerateService
from .settings import GenerateSettings

__all__ = ["create_app"]

log = logging.getLogger("tandem.generate")


def create_app(
    settings: GenerateSettings,
    engine_factory: Callable[[], Engine],
    *,
    shutdown_engine: bool = True,
    on_engine_dead: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the app; the engine is made by ``engine_factory`` at start-up (lifespan), so health
    answers only once the engine is ready. Tests pass a factory returning a shared engine.

    ``on_engine_dead`` is called once if the engine dies; the server entry point stops the
    process with it (a node with a dead engine only answers errors)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = GenerateMetrics.create(registry)
    gate = AdmissionGate(settings.max_pending, "tandem_generate", registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = engine_factory()
        if settings.pretouch_item_cache and keep_freed_memory():
            seconds = pretouch(settings.item_cache_bytes)
            log.info(
                "pre-faulted %d MiB for the item cache in %.2f s",
                settings.item_cache_bytes >> 20,
                seconds,
            )
        app.state.service = GenerateService(settings, engine, metrics)
        log.info("largest request body: %d MiB", app.state.service.max_body_bytes >> 20)
        watch = None
        if on_engine_dead is not None:
            watch = asyncio.create_task(_report_death(engine))
            watch.add_done_callback(lambda t: t.cancelled() or on_engine_dead())
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            if shutdown_engine:
                engine.shutdown()

    app = FastAPI(title="Tandem generate", lifespan=lifespan, openapi_url=None)
    app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key, open_paths=("/health",))
    app.add_middleware(RequestIdMiddleware)
    install_error_handlers(app)

    def service(request: Request) -> GenerateService:
        return request.app.state.service  # type: ignore[no-any-return]

    @app.post("/inference/v1/generate")
    @admitted(gate)
    async def generate(request: Request) -> Response:
        svc = service(request)
        body = await read_body(request, svc.max_body_bytes)
        in_fmt, out_fmt = negotiate(request)
        metrics.bytes_in.labels(in_fmt.name.lower()).inc(len(body))
        req = decode_generate_request(body, in_fmt, svc.limits)
        principal = principal_of(request)
        if req.stream:
            return HeldStreamingResponse(svc.stream(req, principal), media_type="text/event-stream")
        result = await svc.generate(req, request.is_disconnected, principal)
        if result is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return wire_response(result, out_fmt)

    @app.get("/health")
    async def health(request: Request) -> Response:
        engine = service(request).engine
        if engine.errored:
            raise EngineNotReady("the engine has failed")
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        max_len = service(request).engine.max_model_len
        data = [
            {"id": n, "object": "model", "owned_by": "tandem", "max_model_len": max_len}
            for n in settings.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        return JSONResponse({"reset": await service(request).engine.reset_prefix_cache()})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        # Every worker's values (from their files) in multiprocess mode, else this app's.
        return metrics_response(registry)

    return app


async def _report_death(engine: Engine) -> None:
    await engine.wait_until_dead()
    log.error("the vLLM engine died; stopping this server so that it is restarted")
