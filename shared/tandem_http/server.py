"""Run an app factory under uvicorn, with several worker processes sharing one port."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import uvicorn

from .metrics import MULTIPROC_ENV, prepare_multiprocess_dir

__all__ = ["run_server"]


def run_server(
    app_factory: str,
    *,
    host: str,
    port: int,
    workers: int,
    env: dict[str, str],
    log_level: str = "info",
) -> None:
    """Serve ``app_factory`` (``"package.module:create"``) until SIGINT/SIGTERM.

    ``env`` goes into ``os.environ`` first: with ``workers > 1`` uvicorn's supervisor spawns
    fresh processes that each import and call the factory, so environment variables (e.g.
    serialized settings) are how the factory gets its configuration. On SIGTERM uvicorn stops
    accepting connections and gives in-flight requests up to 30 s to finish.
    """
    os.environ.update(env)
    own_metrics_dir: Path | None = None
    preset_dir = os.environ.get(MULTIPROC_ENV)
    if workers > 1 or preset_dir:
        # Before uvicorn spawns workers, so each one starts in multiprocess metrics mode; a
        # folder named by the operator is emptied of stale files but left in place.
        metrics_dir = prepare_multiprocess_dir(None)
        own_metrics_dir = None if preset_dir else metrics_dir
    try:
        uvicorn.run(
            app_factory,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            timeout_graceful_shutdown=30,
            # Client addresses are the socket peers: no proxy is trusted to rewrite them.
            proxy_headers=False,
        )
    finally:
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)
