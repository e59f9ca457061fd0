"""Run an app factory under uvicorn: one process, or N worker processes sharing one port.

Workers each listen on their own ``SO_REUSEPORT`` socket, so the kernel spreads connections
across them. (uvicorn's own multi-worker mode shares one listening socket, and on Linux one
worker can end up accepting every connection of a keep-alive client.)

With ``uds`` (``--uds PATH``) the server listens on that Unix-domain socket instead, host and
port unused, as ``vllm serve --uds`` does; Linux has no ``SO_REUSEPORT`` for them, so the
workers share the one socket.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from .draining import DRAIN_GRACE_S, Drain, DrainingConfig, DrainingServer
from .metrics import MULTIPROC_ENV, mark_process_dead, prepare_multiprocess_dir

__all__ = [
    "add_uds_argument",
    "program_name",
    "run_server",
    "serve",
    "unix_socket",
    "usable_cores",
]

log = logging.getLogger("tandem")

_STOP_BOUND_S = DRAIN_GRACE_S + 15
"""How long the supervisor waits for a stopping worker (its drain, then uvicorn's own close)."""
_RESTART_BACKOFF_S = 1.0
"""The first restart's delay; each further failed start doubles it."""
_HEALTHY_AFTER_S = 30.0
"""A worker alive this long counts as started: its next exit restarts the backoff."""
_MAX_FAILED_STARTS = 5
"""Consecutive failed starts of one worker before the server gives up (a worker that cannot
import or build its app would otherwise restart forever)."""


def program_name(module: str) -> str:
    """How a service was started, for its usage line: its console script (``tandem-render``,
    installed with the package) or ``python -m MODULE``."""
    script = Path(sys.argv[0]).name
    return script if script == module.replace("_", "-") else f"python -m {module}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: taskset, a cpuset), else the
    host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class PortInUse(RuntimeError):
    """Another process listens on the address."""


class WorkersFailing(RuntimeError):
    """A worker keeps dying right after it starts."""


class SocketPathUnusable(RuntimeError):
    """The ``--uds`` path cannot be listened on (a server listens there, or it is no socket)."""


def add_uds_argument(parser: Any) -> None:
    """Every service's ``--uds PATH`` (an argparse parser or argument group)."""
    parser.add_argument(
        "--uds",
        metavar="PATH",
        default=None,
        help="listen on this Unix-domain socket instead of --host/--port, as vllm serve's --uds "
        "(clients name the node unix:PATH); a socket file nothing listens on is replaced, "
        "one a server listens on refused, and the file is removed on exit",
    )


@contextmanager
def unix_socket(path: str) -> Iterator[socket.socket]:
    """A Unix-domain socket bound at ``path`` (listening once uvicorn serves on it), its
    file removed on exit unless another server has replaced it since. A socket file nothing
    listens on (left by a killed server) is replaced, as uvicorn does; one a server listens
    on is refused, as a taken port is."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise SocketPathUnusable(f"cannot listen on {path} ({exc.strerror or exc})") from None
    bound = os.stat(path)
    try:
        yield sock
    finally:
        sock.close()
        _remove_if_same(path, bound)


def _clear_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathUnusable(f"{path} exists and is not a socket: not replacing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            # Nothing listens: a killed server's leftover, or one still starting (not
            # listening yet), whose path this server then takes over, as uvicorn's would.
            # (vllm serve refuses any file there, so a killed server blocks its restart.)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        except OSError as exc:  # a full backlog, no permission: someone is there
            raise SocketPathUnusable(f"{path} cannot be taken over ({exc})") from None
    raise SocketPathUnusable(f"{path} is in use by another process")


def _remove_if_same(path: str, bound: os.stat_result) -> None:
    with contextlib.suppress(FileNotFoundError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            os.unlink(path)


def serve(server: DrainingServer, uds: str | None = None) -> None:
    """Run ``server`` in this process on its config's host and port, or on the Unix-domain
    socket ``uds`` (host and port then unused); exits (status 1, the reason on stderr) when
    that socket cannot be taken."""
    if uds is None:
        server.run()
        return
    try:
        with unix_socket(uds) as sock:
            _announce(uds)
            server.run(sockets=[sock])
    except SocketPathUnusable as exc:
        raise SystemExit(f"tandem: {exc}") from None


def _config(app_factory: str, log_level: str) -> DrainingConfig:
    return DrainingConfig(
        app_factory,
        drain=Drain(),
        factory=True,
        log_level=log_level,
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


def _claim(host: str, port: int) -> socket.socket:
    """Bind the address exclusively (so a port another server holds is refused, even one that
    listens with ``SO_REUSEPORT``), then open it to this server's own workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"{host}:{port} is in use by another process ({exc.strerror})") from None
    # Joining the port group after an exclusive bind: workers (same user) may bind it too,
    # a second server's claim still fails. Never listened on, so it takes no connections.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _worker(
    app_factory: str, host: str, port: int, log_level: str, shared: socket.socket | None
) -> None:
    config = _config(app_factory, log_level)  # configures uvicorn's loggers
    if shared is not None:  # the supervisor's Unix-domain socket
        _announce(shared.getsockname())
    sock = _listen(host, port) if shared is None else shared
    DrainingServer(config).run(sockets=[sock])


def _announce(path: str) -> None:
    # uvicorn names the address it bound itself, and says nothing of sockets handed to it.
    logging.getLogger("uvicorn.error").info(
        "Bound unix socket %s: serving on it once the application has started", path
    )


def run_server(
    app_factory: str,
    *,
    host: str,
    port: int,
    workers: int,
    env: dict[str, str],
    log_level: str = "info",
    uds: str | None = None,
) -> None:
    """Serve ``app_factory`` (``"package.module:create"``) until SIGINT/SIGTERM, on
    ``host:port`` or, given ``uds``, on that Unix-domain socket (see ``unix_socket``).

    ``env`` goes into ``os.environ`` first: worker processes import and call the factory
    themselves, so environment variables (e.g. serialized settings) are how the factory gets its
    configuration. On SIGTERM each worker drains: new requests get 503 ``shutting_down`` while
    in-flight ones get up to 30 s to finish; a worker that dies on its own is restarted, with a
    growing delay, and the server exits (status 1, the reason on stderr) when one keeps dying
    right after it starts or when another process holds the port.
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
            serve(DrainingServer(config), uds)
        elif uds is not None:
            with unix_socket(uds) as sock:
                _supervise(app_factory, host, port, workers, log_level, sock)
        else:
            _supervise(app_factory, host, port, workers, log_level)
    except (PortInUse, SocketPathUnusable, WorkersFailing) as exc:
        raise SystemExit(f"tandem: {exc}") from None
    finally:
        if own_metrics_dir is not None:
            shutil.rmtree(own_metrics_dir, ignore_errors=True)


def _supervise(
    app_factory: str,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    shared: socket.socket | None = None,
) -> None:
    """Run and restart the workers; with ``shared`` (a bound Unix-domain socket, handed to
    each worker) they serve on it instead of ``host:port``."""
    # spawn: each worker starts clean and imports the app itself (no state inherited by fork).
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    # Held for the server's life: a port in use fails the launch, not every worker.
    claim = _claim(host, port) if shared is None else None
    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}

    def start(i: int) -> multiprocessing.process.BaseProcess:
        args = (app_factory, host, port, log_level, shared)
        p = ctx.Process(target=_worker, args=args, name=f"worker-{i}")
        p.start()
        return p

    procs = [start(i) for i in range(workers)]
    started_at = [time.monotonic()] * workers
    failed_starts = [0] * workers
    restart_at: list[float | None] = [None] * workers
    try:
        while not stopping:
            time.sleep(0.2)
            now = time.monotonic()
            for i, p in enumerate(procs):
                if restart_at[i] is not None:
                    if now >= (restart_at[i] or 0.0):
                        restart_at[i] = None
                        procs[i], started_at[i] = start(i), now
                    continue
                if p.exitcode is None or stopping:
                    continue
                mark_process_dead(p.pid or 0)
                lived = now - started_at[i]
                failed_starts[i] = failed_starts[i] + 1 if lived < _HEALTHY_AFTER_S else 1
                if failed_starts[i] >= _MAX_FAILED_STARTS:
                    raise WorkersFailing(
                        f"worker {i} died {failed_starts[i]} times in a row right after "
                        f"starting (last exit status {p.exitcode}); giving up"
                    )
                delay = _RESTART_BACKOFF_S * 2 ** (failed_starts[i] - 1)
                log.error(
                    "worker %d (pid %s) exited with %s; restarting in %.0f s",
                    i,
                    p.pid,
                    p.exitcode,
                    delay,
                )
                restart_at[i] = now + delay
    finally:
        if claim is not None:
            claim.close()
        for p in procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker drains
        deadline = time.monotonic() + _STOP_BOUND_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
            mark_process_dead(p.pid or 0)
        for s, handler in previous.items():
            signal.signal(s, handler)
