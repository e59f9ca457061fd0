"""A tiny app factory for test_server: imported by each uvicorn worker process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import Counter
from starlette.responses import Response

from tandem_http import RequestIdMiddleware, install_error_handlers, metrics_response


def create() -> FastAPI:
    # Settings arrive through the environment, as run_server's ``env`` puts them there.
    greeting = os.environ["TANDEM_HTTP_TEST_GREETING"]
    hellos = Counter("tandem_http_test_hellos", "Hello requests served.")
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/hello")
    async def hello() -> dict[str, str | int]:
        hellos.inc()
        return {"greeting": greeting, "pid": os.getpid()}

    @app.get("/slow")
    async def slow(marker: str, seconds: float = 1.0) -> dict[str, str]:
        # Tells the test the request is in flight, then outlives the SIGTERM it sends.
        Path(marker).touch()
        await asyncio.sleep(seconds)
        return {"slow": "done"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return metrics_response()

    app.add_middleware(RequestIdMiddleware)
    return app
