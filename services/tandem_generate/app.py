"""The generate service's HTTP face: thin routes (decode -> call -> encode) over GenerateService."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import httpx
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry

from tandem_http import (
    CONTROL_BODY_BYTES,
    MAX_BODY_HEADER,
    AdmissionGate,
    BadRequest,
    BodyDeadline,
    ControlAccess,
    SendDeadline,
    add_server_info_routes,
    admitted,
    held_bytes_budget,
    keep_freed_memory,
    metrics_response,
    models_response,
    negotiate,
    pretouch,
    principal_of,
    read_body,
    service_app,
    slot_of,
    wire_response,
)
from tandem_http.openapi import BodySchemas, install_openapi
from tandem_wire import (
    PROMPT_TOKENS_DETAILS_HEADER,
    SYSTEM_FINGERPRINT_HEADER,
    WireFormat,
    decode_document,
)
from tandem_wire.control import (
    UPDATE_ID_HEADER,
    UPDATE_RECEIVED_HEADER,
    AbortRequestsRequest,
    FinishWeightUpdateRequest,
    InitWeightTransferRequest,
    UpdateId,
    UpdateReceipt,
    UpdateWeightsRequest,
    UpdateWeightVersionRequest,
)
from tandem_wire.streams import STREAM_CONTENT_TYPE, accepts_stream_frames

from .control import EngineControl
from .engine import Engine
from .errors import EngineNotReady
from .metrics import GenerateMetrics
from .schemas import GENERATE_PATH, body_schemas
from .serving import GenerateService
from .settings import GenerateSettings

__all__ = ["create_app"]

log = logging.getLogger("tandem.generate")


T = TypeVar("T")


def create_app(
    settings: GenerateSettings,
    engine_factory: Callable[[], Engine],
    *,
    shutdown_engine: bool = True,
    on_engine_dead: Callable[[], None] | None = None,
    render_transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """Build the app; the engine is made by ``engine_factory`` at start-up (lifespan), so health
    answers only once the engine is ready. Tests pass a factory returning a shared engine.

    ``on_engine_dead`` is called once if the engine dies; the server entry point stops the
    process with it (a node with a dead engine only answers errors). ``render_transport``:
    how the render node that resolves ``content_parts`` is reached (None: the network)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = GenerateMetrics.create(registry)
    gate = AdmissionGate(
        settings.max_pending,
        "tandem_generate",
        registry,
        max_bytes=held_bytes_budget(settings.max_held_bytes),
    )

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
        app.state.service = GenerateService(settings, engine, metrics, render_transport)
        log.info("largest request body: %d MiB", app.state.service.max_body_bytes >> 20)
        budget = "none" if gate.max_bytes is None else f"{gate.max_bytes >> 20} MiB"
        log.info("admission: %d requests, byte budget %s", gate.limit, budget)
        app.state.control = EngineControl(
            engine, settings.weight_transfer_dir, settings.update_idle_timeout_s
        )
        watch = None
        if on_engine_dead is not None:
            watch = asyncio.create_task(_report_death(engine))
            watch.add_done_callback(lambda t: t.cancelled() or on_engine_dead())
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            await app.state.service.aclose()
            if shutdown_engine:
                engine.shutdown()

    app = service_app(
        "Tandem generate",
        lifespan,
        settings.api_key,
        settings.admin_api_key,
        BodyDeadline.of(settings.body_timeout_s, settings.body_min_rate),
        settings.door_api_key,
        SendDeadline.of(settings.send_timeout_s, settings.send_min_rate),
    )

    def service(request: Request) -> GenerateService:
        return request.app.state.service  # type: ignore[no-any-return]

    @app.post(GENERATE_PATH)
    @admitted(gate)
    async def generate(request: Request) -> Response:
        svc = service(request)
        body = await read_body(request, svc.max_body_bytes)
        in_fmt, out_fmt = negotiate(request)
        metrics.bytes_in.labels(in_fmt.name.lower()).inc(len(body))
        principal, slot = principal_of(request), slot_of(request)
        req = await svc.resolve_content_parts(svc.decode(body, in_fmt, slot), slot)
        fingerprint = svc.engine.system_fingerprint
        headers = {SYSTEM_FINGERPRINT_HEADER: fingerprint} if fingerprint else None
        cached = request.headers.get(PROMPT_TOKENS_DETAILS_HEADER, "").lower() == "true"
        if req.stream:
            # The binary stream only for a caller that names it (the front door); SSE, as
            # upstream's, for every other.
            framed = accepts_stream_frames(request.headers.get("accept"))
            events = svc.stream(req, principal, slot, cached, framed)
            media = STREAM_CONTENT_TYPE if framed else "text/event-stream"
            return StreamingResponse(events, media_type=media, headers=headers)
        result = await svc.generate(req, request.is_disconnected, principal, slot, cached)
        if result is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return wire_response(result, out_fmt, headers=headers)

    @app.get("/health")
    async def health(request: Request) -> Response:
        svc = service(request)
        if svc.engine.errored:
            raise EngineNotReady("the engine has failed")
        # Tandem's extension: the body cap, which a front door in front of this node follows.
        return JSONResponse({"status": "ok"}, headers={MAX_BODY_HEADER: str(svc.max_body_bytes)})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return models_response(settings.served_model_names, service(request).engine.max_model_len)

    add_server_info_routes(app, gate, health, lambda r: service(r).engine.vllm_version)

    @app.get("/kv_event_sources")
    async def kv_event_sources(request: Request) -> Response:
        return JSONResponse(service(request).engine.kv_event_sources())

    access = ControlAccess(settings.api_key, settings.admin_api_key, settings.enable_control_routes)

    def control(request: Request) -> EngineControl:
        """For a state-changing control route: only for admins (see ``ControlAccess``),
        checked before its body is read or the engine touched."""
        access.check(request, request.url.path)
        return request.app.state.control  # type: ignore[no-any-return]

    def observe(request: Request) -> EngineControl:
        """For a read-only control route: served as /v1/models is."""
        return request.app.state.control  # type: ignore[no-any-return]

    async def body_of(request: Request, type_: type[T], empty: T | None = None) -> T:
        """A JSON control body (``empty`` stands for a missing body where one is optional)."""
        raw = await read_body(request, CONTROL_BODY_BYTES)
        if empty is not None and not raw.strip():
            return empty
        return decode_document(raw, type_, WireFormat.JSON)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        # Upstream's answer (vLLM >= 0.26): false while requests are running.
        return JSONResponse({"success": await control(request).reset_prefix_cache()})

    # vLLM 0.32's RL routes (vllm/entrypoints/rl/online/api_router.py), same shapes.
    @app.post("/pause")
    async def pause(request: Request, mode: str = "abort", clear_cache: bool = True) -> Response:
        await control(request).pause(mode, clear_cache)
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume(request: Request) -> Response:
        await control(request).resume()
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused(request: Request) -> Response:
        return JSONResponse({"is_paused": await observe(request).is_paused()})

    @app.post("/abort_requests")
    async def abort_requests(request: Request) -> Response:
        ctl = control(request)
        req = await body_of(request, AbortRequestsRequest, AbortRequestsRequest())
        return JSONResponse(
            {"status": "aborted", "aborted": await ctl.abort_requests(req.request_ids)}
        )

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request) -> Response:
        ctl = control(request)
        await ctl.init_transfer((await body_of(request, InitWeightTransferRequest)).init_info)
        return JSONResponse({"message": "Weight transfer initialized"})

    @app.post("/start_weight_update")
    async def start_weight_update(request: Request) -> Response:
        ctl = control(request)
        update_id = await ctl.start_update(update_id_of(request))
        return JSONResponse({"message": "Weight update started", "update_id": str(update_id)})

    @app.post("/update_weights")
    async def update_weights(request: Request) -> Response:
        ctl = control(request)
        await ctl.update((await body_of(request, UpdateWeightsRequest)).update_info)
        return JSONResponse({"message": "Weights updated"})

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request) -> Response:
        ctl = control(request)
        req = await body_of(request, FinishWeightUpdateRequest, FinishWeightUpdateRequest())
        await ctl.finish_update(req.weight_version, received_of(request))
        return JSONResponse({"message": "Weight update finished"})

    @app.post("/abort_weight_update")
    async def abort_weight_update(request: Request) -> Response:
        # Tandem's: ends an update under way without loading it (a fleet's start that failed
        # on another node is undone with it); answers alike when none was under way.
        aborted = await control(request).abort_update()
        return JSONResponse({"message": "Weight update aborted", "aborted": aborted})

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        ctl = control(request)
        version = (await body_of(request, UpdateWeightVersionRequest)).new_version
        await ctl.set_version(version)
        return JSONResponse({"success": True, "new_version": version})

    @app.get("/weight_info")
    async def weight_info(request: Request) -> Response:
        info = await observe(request).weight_info()
        return Response(msgspec.json.encode(info), media_type="application/json")

    @app.get("/get_world_size")
    async def get_world_size(request: Request, include_dp: bool = True) -> Response:
        return JSONResponse({"world_size": observe(request).world_size(include_dp)})

    @app.get("/server_info")
    async def server_info(request: Request) -> Response:
        return JSONResponse(observe(request).server_info())

    @app.get("/metrics")
    async def metrics_route() -> Response:
        # Every worker's values (from their files) in multiprocess mode, else this app's.
        return metrics_response(registry)

    async def schemas(request: Request) -> BodySchemas:
        return body_schemas()

    install_openapi(app, schemas)
    return app


def update_id_of(request: Request) -> UpdateId | None:
    """The update id a fleet router sent with ``/start_weight_update`` (None: none sent)."""
    return _header(request, UPDATE_ID_HEADER, UpdateId.parse)


def received_of(request: Request) -> str | None:
    """What a fleet router says this node must have taken of the update it finishes
    (``UPDATE_RECEIVED_HEADER``; None: not said, the node finishes as vLLM's does)."""
    return _header(request, UPDATE_RECEIVED_HEADER, UpdateReceipt.check_header)


def _header(request: Request, name: str, parse: Callable[[str], T]) -> T | None:
    """Header ``name`` read by ``parse`` (None when absent); a value it refuses is a 400."""
    told = request.headers.get(name)
    if told is None:
        return None
    try:
        return parse(told)
    except ValueError as exc:
        raise BadRequest(str(exc), param=name) from None


async def _report_death(engine: Engine) -> None:
    await engine.wait_until_dead()
    log.error("the vLLM engine died; stopping this server so that it is restarted")
