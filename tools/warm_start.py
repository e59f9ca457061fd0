"""Server processes forked from a warm parent, for the test session.

Every server the integration suite starts (``python -m tandem_generate``, ``vllm serve``'s
module, ...) spends its first seconds importing vLLM, torch and transformers: about 8 s of one
core here, on each of the suite's ~100 starts. The warm parent imports them once and forks each
server from that state instead of executing a new interpreter; the child then runs the server's
module as ``python -m`` would (``runpy``, ``__main__``, the same ``sys.argv``), in its own
session, with its output in its own log file.

What stays as it was, and why it is safe:

- The parent is single-threaded when it forks (it checks; a thread started by an import would
  make the fork unsafe, and it then refuses to serve). No OpenMP pool, event loop or engine
  exists in it: those start in the child, as in a fresh process.
- Only a server whose environment is the one the parent imported under (test-local variables
  aside) is forked: a variable read at import time (libgomp's ``OMP_NUM_THREADS``,
  transformers' offline flags, vLLM's log level) is then the one the imports saw. The child
  keeps the parent's environment as its imports left it (vLLM's own settings, such as
  ``TORCHINDUCTOR_COMPILE_THREADS``, included), which is what a fresh interpreter has once it
  has imported the same. ``tools.servers`` starts everything else as a fresh interpreter, and
  gives every server the environment the parent started with (:attr:`WarmParent.environment`),
  not what the test process's own imports add to it later (TRL's import sets
  ``VLLM_LOGGING_LEVEL``, vLLM's its torch settings).
- What a server spawns itself (vLLM's engine core, uvicorn workers) is spawned as before: a
  fresh interpreter that imports what it needs, and pickles what it is given.
- ``random`` is reseeded in each child by CPython's own at-fork hook.

The protocol: one JSON line per request on a Unix socket, one JSON line per answer.
``{"start": {...}}`` answers the child's pid; ``{"poll": pid}`` its exit code (``null`` while it
runs, negative for a signal, as ``subprocess`` writes it). The parent reaps its children.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What every server here imports before it does anything: vLLM's OpenAI server (torch,
# transformers, FastAPI, the engine client), its render launcher and our three services.
PRELOAD = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.launchers.render.entry",
    "tandem_render.__main__",
    "tandem_generate.__main__",
    "tandem_front.__main__",
)

# Variables pytest changes under a running test; no server reads them.
TEST_LOCAL_ENV = ("PYTEST_CURRENT_TEST",)


def comparable_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the variables that may differ between the parent and a forked child."""
    return {k: v for k, v in env.items() if k not in TEST_LOCAL_ENV}


class WarmParentError(RuntimeError):
    """The warm parent could not start or answer."""


class WarmChild:
    """A server forked by the warm parent, managed as ``subprocess.Popen`` manages its own."""

    def __init__(self, parent: WarmParent, pid: int, args: list[str]):
        self._parent = parent
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._parent.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmParent:
    """The test process's handle on the warm parent (started by :meth:`start`, stopped by
    :meth:`stop`); calls from several threads are taken one at a time."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: str, log: Path):
        self._proc = proc
        self._socket_path = socket_path
        self._log = log
        self._conn: tuple[socket.socket, Any] | None = None
        self._lock = threading.Lock()
        self.environment = comparable_env(os.environ)
        """The environment the parent was started with (and imported under), test-local
        variables aside."""
        self._cwd = os.getcwd()  # the parent's, and its sys.path[0]

    @classmethod
    def start(cls, preload: tuple[str, ...] = PRELOAD) -> WarmParent:
        """Start the parent importing ``preload``; it imports in the background while the
        caller goes on."""
        folder = tempfile.mkdtemp(prefix="tandem-warm-")
        path = os.path.join(folder, "parent.sock")
        log = Path(folder, "parent.log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tools.warm_start", path, *preload],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(proc, path, log)

    def can_fork(self, args: list[str], env: Mapping[str, str]) -> bool:
        """Whether a server of this command line and environment may be forked: a module run
        by this interpreter, in the environment the parent imported under."""
        is_module = args[:2] == [sys.executable, "-m"] and len(args) > 2
        same_place = os.getcwd() == self._cwd
        return is_module and same_place and comparable_env(env) == self.environment

    def spawn(self, args: list[str], env: Mapping[str, str], log: Path) -> WarmChild:
        """Fork a server running ``args`` (``python -m module ...``) with output to ``log``;
        ``env`` is one :meth:`can_fork` took, so only its test-local variables are sent."""
        test_local = {k: env[k] for k in TEST_LOCAL_ENV if k in env}
        request = {"start": {"argv": args, "test_env": test_local, "log": str(log)}}
        pid = self._ask(request)
        if not isinstance(pid, int):
            raise WarmParentError(f"the warm parent did not start {args}: {pid}")
        return WarmChild(self, pid, args)

    def exit_code(self, pid: int) -> int | None:
        code = self._ask({"poll": pid})
        return code if isinstance(code, int) else None

    def _ask(self, request: dict[str, Any]) -> Any:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            conn, reader = self._conn
            conn.sendall(json.dumps(request).encode() + b"\n")
            line = reader.readline()
        if not line:
            raise WarmParentError(f"the warm parent hung up:\n{self._log_text()}")
        return json.loads(line)["answer"]

    def _connect(self, timeout: float = 300.0) -> tuple[socket.socket, Any]:
        """Wait for the parent's imports to end (it listens only then)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise WarmParentError(f"the warm parent exited:\n{self._log_text()}")
            conn = socket.socket(socket.AF_UNIX)
            try:
                conn.connect(self._socket_path)
                return conn, conn.makefile("rb")
            except OSError:
                conn.close()
            if time.monotonic() > deadline:
                raise WarmParentError(f"the warm parent is not ready:\n{self._log_text()}")
            time.sleep(0.2)

    def _log_text(self) -> str:
        return self._log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Stop the parent (the servers it forked are their callers' to stop)."""
        if self._conn is not None:
            self._conn[0].close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)


# The parent's side.


def _run_child(request: dict[str, Any], held: list[socket.socket]) -> None:
    """In the forked child: become the server ``python -m`` would have started. It never
    returns: the server's exit unwinds as ``SystemExit`` through the parent's loop to the
    interpreter's own exit (threads joined, ``atexit`` run, streams flushed), and an
    uncaught error is printed and exits 1, as in a fresh interpreter."""
    for sock in held:
        sock.close()
    os.setsid()
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (out, 1), (out, 2)):
        os.dup2(fd, target)
    os.close(out)
    os.close(devnull)
    # The parent's environment as its imports left it; only the test-local variables differ.
    for name in TEST_LOCAL_ENV:
        os.environ.pop(name, None)
        if name in request["test_env"]:
            os.environ[name] = request["test_env"][name]
    _, _, module, *args = request["argv"]
    # A fresh `python -m` holds the module only as __main__: run it anew, not the preloaded copy.
    for name in (module, f"{module}.__main__"):
        sys.modules.pop(name, None)
    sys.argv = [request["argv"][0], *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


class _Reaper:
    """Exit codes of the parent's children, collected whenever it is asked."""

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.codes[pid] = os.waitstatus_to_exitcode(status)

    def code(self, pid: int) -> int | None:
        self.reap()
        return self.codes.get(pid)


def _serve(path: str, preload: list[str]) -> None:
    for module in preload:
        importlib.import_module(module)
    threads = threading.enumerate()
    tasks = os.listdir("/proc/self/task")
    if len(threads) > 1 or len(tasks) > 1:
        # A fork copies one thread; a lock another held stays held in the child for ever.
        raise SystemExit(f"not forking beside threads: {threads}, {len(tasks)} tasks")
    reaper = _Reaper()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    print(f"warm parent ready: {len(sys.modules)} modules imported", flush=True)
    conn, _ = listener.accept()
    reader = conn.makefile("rb")
    for line in reader:
        request = json.loads(line)
        if "poll" in request:
            answer: Any = reaper.code(int(request["poll"]))
        else:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                reader.close()
                _run_child(request["start"], [conn, listener])
            answer = pid
        conn.sendall(json.dumps({"answer": answer}).encode() + b"\n")


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2:])
