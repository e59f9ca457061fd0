"""Run servers as child processes on 127.0.0.1 free ports for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import httpx

from tools.warm_start import WarmChild, WarmParent

_warm_parent: WarmParent | None = None


def fork_servers_from(parent: WarmParent | None) -> None:
    """Start the servers whose command and environment allow it by forking them from
    ``parent`` (the test session's warm parent, ``tools.warm_start``); None: as fresh
    interpreters again, as everything but the test session does."""
    global _warm_parent
    _warm_parent = parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server started as a child process; its output goes to a log file printed on failure."""

    def __init__(
        self,
        name: str,
        args: list[str],
        port: int,
        env: dict[str, str] | None = None,
        uds: str | None = None,
    ):
        self.name = name
        self.args = args
        self.env = env
        self.port = port
        self.uds = uds
        """The Unix-domain socket it listens on (its ``--uds``) instead of ``port``."""
        self.url = f"unix:{uds}" if uds else f"http://127.0.0.1:{port}"
        self.log = Path(tempfile.mkstemp(prefix=f"tandem-{name}-", suffix=".log")[1])
        self._rebinds = 0
        self._launch()

    def _launch(self) -> None:
        self._log_file = self.log.open("wb")
        # With a warm parent, every server gets the environment the parent started with: the
        # test process's later imports (TRL's, vLLM's) add variables no server should inherit.
        base = os.environ if _warm_parent is None else _warm_parent.environment
        env = {**base, **(self.env or {})}
        self.proc: subprocess.Popen[bytes] | WarmChild
        if _warm_parent is not None and _warm_parent.can_fork(self.args, env):
            self.proc = _warm_parent.spawn(self.args, env, self.log)
            return
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its workers are stopped with it
        )

    def _lost_its_port(self) -> bool:
        """It exited because its port was taken meanwhile: a free port is only free when
        picked, and an engine binds its HTTP port tens of seconds later."""
        return self._rebinds < 3 and "address already in use" in self.log_text()

    def _rebind(self) -> None:
        self._log_file.close()
        self.port = free_port()
        at = self.args.index("--port") + 1
        self.args = [*self.args[:at], str(self.port), *self.args[at + 1 :]]
        self.url = f"http://127.0.0.1:{self.port}"
        self._rebinds += 1
        self._launch()

    def restarted(self) -> ServerProcess:
        """The same server started again (same command, port and environment)."""
        return ServerProcess(self.name, self.args, self.port, self.env, self.uds)

    def get(self, path: str, timeout: float = 10) -> httpx.Response:
        """GET ``path`` from it, over its socket if it listens on one."""
        if self.uds is None:
            return httpx.get(f"{self.url}{path}", timeout=timeout)
        with httpx.Client(transport=httpx.HTTPTransport(uds=self.uds)) as client:
            return client.get(f"http://localhost{path}", timeout=timeout)

    def log_text(self, tail: int = 8000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def wait_healthy(self, timeout: float = 180.0, path: str = "/health") -> None:
        """Until ``path`` answers 200 (a door without render nodes: ``/weight_info``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._lost_its_port():
                    self._rebind()
                    continue
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}):\n{self.log_text()}"
                )
            try:
                if self.get(path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout}s:\n{self.log_text()}")

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        # What is left of its group (an engine core or worker whose server died first, as a
        # fault test makes it) would hold memory and CPU for the rest of a test session.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log_file.close()
        if self.proc.returncode not in (0, -signal.SIGTERM, None):
            print(f"--- {self.name} log ---\n{self.log_text()}", file=sys.stderr)


@contextlib.contextmanager
def serving(procs: Collection[ServerProcess], timeout: float = 180.0) -> Iterator[None]:
    """For the block: every server of ``procs`` healthy, waited on in turn; afterwards every
    one stopped, also when one never became healthy. ``procs`` is read again when the block
    ends, so a server added or replaced in it meanwhile is stopped too."""
    try:
        for proc in procs:
            proc.wait_healthy(timeout=timeout)
        yield
    finally:
        for proc in procs:
            proc.stop()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def service_command(module: str, *args: str) -> list[str]:
    """One of our services by the command users run, the console script the package installs
    beside this interpreter (``tandem_render`` -> ``tandem-render``); ``python -m`` where the
    package is not installed."""
    script = Path(sys.executable).with_name(module.replace("_", "-"))
    return [str(script), *args] if script.exists() else python_module(module, *args)


# The four servers tests and benchmarks start, each on 127.0.0.1 and a free port.
CPU_ENGINE_ARGS = (
    "--enforce-eager",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    "8",
    "--seed",
    "0",
)


SERVER_ITEM_CACHE_BYTES = str(128 * 1024 * 1024)
"""Generate's item cache in the servers started here (a caller's own ``--item-cache-bytes``
wins). Its default, 1 GiB faulted in at start-up, is 1 GiB of RSS per process that no test
fills: at the test session's low point (four engines, three of them ours) 2.2 GiB of this
machine's 24 were left, and a process short of memory stalls while its engine runs on."""


# vLLM's own default binding of a CPU engine's OpenMP threads (``make`` exports ``nobind``
# for everything it runs; benchmarks that compare engines give both this one).
VLLM_DEFAULT_BINDING = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}


def _start(
    name: str,
    module: str,
    args: list[str],
    env: dict[str, str] | None = None,
    uds: str | None = None,
) -> ServerProcess:
    """The server on a free port, or on the Unix-domain socket ``uds`` (our services)."""
    if uds is not None:
        return ServerProcess(name, python_module(module, *args, "--uds", uds), 0, env, uds)
    port = free_port()
    return ServerProcess(name, python_module(module, *args, "--port", str(port)), port, env)


def upstream_render(model: str, *options: str) -> ServerProcess:
    """vLLM's own GPU-less render server (`vllm launch render`; ``options``: more of its
    command-line options)."""
    return _start(
        "upstream-render",
        "vllm.entrypoints.launchers.render.entry",
        ["--model", model, "--host", "127.0.0.1", *options],
    )


def upstream_serve(model: str, *options: str, env: dict[str, str] | None = None) -> ServerProcess:
    """vLLM's OpenAI server with the scale-out routes (`/inference/v1/generate`); ``options``:
    more of its command-line options; ``env``: variables set over this process's environment."""
    return _start(
        "upstream-serve",
        "vllm.entrypoints.openai.api_server",
        ["--model", model, "--host", "127.0.0.1", "--enable-scale-out", *CPU_ENGINE_ARGS, *options],
        env,
    )


def tandem_render(
    model: str, *options: str, workers: int | None = 1, uds: str | None = None
) -> ServerProcess:
    """Our render server (``options``: more of its command-line options; ``workers`` None:
    the service's default count; ``uds``: listen on that socket instead of a port)."""
    args = ["--model", model, *_workers(workers), *options]
    return _start("tandem-render", "tandem_render", args, uds=uds)


def _workers(workers: int | None) -> list[str]:
    return [] if workers is None else ["--workers", str(workers)]


def tandem_generate(
    model: str,
    weight_dir: str | None = None,
    *options: str,
    env: dict[str, str] | None = None,
    uds: str | None = None,
) -> ServerProcess:
    """Our generate server; control routes on (it binds 127.0.0.1), and with ``weight_dir`` the
    tandem_file weight-transfer backend reading updates from that folder (``options``: more of
    its command-line options; ``env``: variables set over this process's environment;
    ``uds``: listen on that socket instead of a port)."""
    args = ["--model", model, "--enable-control-routes", *CPU_ENGINE_ARGS]
    args += ["--item-cache-bytes", SERVER_ITEM_CACHE_BYTES, *options]
    if weight_dir is not None:
        args += [*weight_transfer_args(weight_dir)]
    return _start("tandem-generate", "tandem_generate", args, env, uds)


def weight_transfer_args(weight_dir: str) -> list[str]:
    """The generate options for weight updates through files in ``weight_dir``."""
    return [
        "--weight-transfer-config",
        '{"backend": "tandem_file"}',
        "--weight-transfer-dir",
        weight_dir,
    ]


def tandem_front(
    model: str,
    render: str | list[str],
    generate: str | list[str],
    *extra: str,
    workers: int | None = 1,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """The front door over the given render and generate URLs (extra flags appended;
    ``workers`` None: the service's default count; ``env``: variables set over this
    process's environment)."""

    def joined(urls: str | list[str]) -> str:
        return urls if isinstance(urls, str) else ",".join(urls)

    args = ["--model", model, "--render", joined(render), "--generate", joined(generate)]
    return _start("tandem-front", "tandem_front", [*args, *_workers(workers), *extra], env)
