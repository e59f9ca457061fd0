"""Run an app factory under uvicorn: one process, or N worker processes sharing one port.

Workers each listen on their own ``SO_REUSEPORT`` socket, so the kernel spreads connections
across them. (uvicorn's own multi-worker mode shares one listening socket, and on Linux one
worker can end up accepting every connection of a keep-alive client.)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from types import FrameType

import uvicorn

from .metrics import MULTIPROC_ENV, mark_process_dead, prepare_multiprocess_dir

__all__ = ["run_server"]

log = logging.getLogger("tandem")

_GRACE_S = 30
_RESTART_BACKOFF_S = 1.0


def _config(app_factory: str, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app_factory,
        factory=True,
        log_level=log_level,
        timeout_graceful_shutdown=_GRACE_S,
        # Client addresses are the socket peers: no proxy is trusted to rewrite them.
        proxy_headers=False,
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _worker(app_factory: str, host: str, port: int, log_level: str) -> None:
    sock = _listen(host, port)
    uvicorn.Server(_config(app_factory, log_level)).run(sockets=[sock])


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

    ``env`` goes into ``os.environ`` first: worker processes import and call the factory
    themselves, so environment variables (e.g. serialized settings) are how the factory gets its
    configuration. On SIGTERM workers stop accepting connections and give in-flight requests up
    to 30 s to finish; a worker that dies on its own is restarted.
    """
    os.environ.update(env)
    own_metrics_dir: Path | None = None
    preset_dir = os.environ.get(MULTIPROC_ENV)
    if workers > 1 or preset_dir:
        # Before any worker starts, so each one starts in multiprocess metrics mode; a folder
        # named by the operator is emptied of stale files but left in place.
        metrics_dir = prepare_multiprocess_dir(None)
        own_metrics_dir = None if preset_dir else metrics_dir
    try:
        if workers <= 1:
            config = _config(app_factory, log_level)
            config.host, config.port = host, port
            uvicorn.Server(config).run()
        else:
            _supervise(app_factory, host, port, workers, log_level)
    finally:
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)


def _supervise(app_factory: str, host: str, port: int, workers: int, log_level: str) -> None:
    # spawn: each worker starts clean and imports the app itself (no state inherited by fork).
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    # Probe the address once here, so a port in use fails the launch instead of every worker.
    _listen(host, port).close()

    def start(i: int) -> multiprocessing.process.BaseProcess:
        p = ctx.Process(
            target=_worker, args=(app_factory, host, port, log_level), name=f"worker-{i}"
        )
        p.start()
        return p

    procs = [start(i) for i in range(workers)]
    try:
        while not stopping:
            time.sleep(0.2)
            for i, p in enumerate(procs):
                if p.exitcode is not None and not stopping:
                    log.error("worker %d (pid %s) exited with %s; restarting", i, p.pid, p.exitcode)
                    mark_process_dead(p.pid or 0)
                    time.sleep(_RESTART_BACKOFF_S)
                    procs[i] = start(i)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: uvicorn finishes in-flight requests
        deadline = time.monotonic() + _GRACE_S + 5
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
            mark_process_dead(p.pid or 0)
        for s, handler in previous.items():
            signal.signal(s, handler)
