"""``--uds``: servers on a Unix-domain socket. A leftover socket file is replaced, a live one
refused, anything else left alone; workers share the socket; the file goes on a clean stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tandem_http import MULTIPROC_ENV
from tandem_http.server import SocketPathUnusable, unix_socket

ROOT = Path(__file__).resolve().parents[3]

_LAUNCH = """
import sys
from tandem_http import run_server
run_server(
    "tests.unit.http.factory_app:create",
    host="127.0.0.1",
    port=1,  # unused: the socket is the address
    workers=int(sys.argv[2]),
    env={"TANDEM_HTTP_TEST_GREETING": "hi"},
    uds=sys.argv[1],
)
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    # Short: a socket path holds at most 107 bytes, and pytest's tmp_path can be long.
    with tempfile.TemporaryDirectory(prefix="th-", dir="/tmp") as name:
        yield Path(name)


def _leftover(path: Path) -> None:
    """A socket file as a killed server leaves it: bound once, nobody listening."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def test_a_leftover_socket_file_is_replaced_and_removed_on_exit(folder):
    path = folder / "s.sock"
    _leftover(path)
    with unix_socket(str(path)) as sock:
        sock.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # the new socket is the one at the path
    assert not path.exists()


def test_a_socket_a_server_listens_on_is_refused_and_left(folder):
    path = folder / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(SocketPathUnusable, match="in use"), unix_socket(str(path)):
            pass
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the first server's


def test_a_file_that_is_no_socket_is_never_replaced(folder):
    path = folder / "notes.txt"
    path.write_text("keep me")
    with pytest.raises(SocketPathUnusable, match="not a socket"), unix_socket(str(path)):
        pass
    assert path.read_text() == "keep me"
    with pytest.raises(SocketPathUnusable, match="cannot listen"):
        with unix_socket(str(folder / "no-such-folder" / "s.sock")):
            pass


def test_a_successors_socket_is_not_removed_on_exit(folder):
    path = folder / "s.sock"
    with unix_socket(str(path)):
        path.unlink()  # an operator (or a second server) took the path over meanwhile
        _leftover(path)
        successor = path.stat().st_ino
    assert path.stat().st_ino == successor


def _launch(path: Path, workers: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(path), str(workers)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _hello(path: Path) -> httpx.Response | None:
    """One request on a new connection over the socket; None while nobody answers."""
    transport = httpx.HTTPTransport(uds=str(path))
    try:
        with httpx.Client(transport=transport, base_url="http://node", timeout=5) as c:
            return c.get("/hello")
    except httpx.TransportError:
        return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_server_on_a_socket_serves_from_every_worker_and_removes_it(folder, workers):
    path = folder / "node.sock"
    _leftover(path)  # the previous run was killed
    log = folder / "server.log"
    proc = _launch(path, workers, log)
    ok = False
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 60
        while len(pids) < workers and time.monotonic() < deadline:
            assert proc.poll() is None, "the server exited early"
            answer = _hello(path)
            if answer is not None:
                assert answer.status_code == 200 and answer.json()["greeting"] == "hi"
                pids.add(answer.json()["pid"])
            time.sleep(0.05)
        assert len(pids) == workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not path.exists()
        assert log.read_text().count(f"Bound unix socket {path}") == workers
        ok = True
    finally:
        _stop(proc)
        if not ok:
            print(log.read_text(errors="replace"))


def test_a_second_server_on_a_live_socket_is_refused(folder):
    path = folder / "node.sock"
    first = _launch(path, 1, folder / "first.log")
    try:
        for _ in range(600):
            if _hello(path) is not None:
                break
            time.sleep(0.05)
        second = _launch(path, 2, folder / "second.log")
        try:
            assert second.wait(timeout=60) == 1
        finally:
            _stop(second)
        assert "is in use by another process" in (folder / "second.log").read_text()
        answer = _hello(path)
        assert answer is not None and answer.status_code == 200  # the first still serves
    finally:
        _stop(first)


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("tandem_render", ["--model", "m"]),
        ("tandem_front", ["--model", "m", "--render", "http://r", "--generate", "http://g"]),
    ],
)
def test_the_uds_flag_reaches_the_server(monkeypatch, module, argv):
    import importlib

    served: dict = {}
    monkeypatch.setattr("tandem_http.server.run_server", lambda factory, **kw: served.update(kw))
    importlib.import_module(f"{module}.__main__").main([*argv, "--uds", "/run/t/node.sock"])
    assert served["uds"] == "/run/t/node.sock"


@pytest.mark.vllm
def test_generate_takes_the_uds_flag(qwen2_dir):
    from tandem_generate.__main__ import parse_args

    assert parse_args(["--model", qwen2_dir, "--uds", "/run/t/g.sock"])[0].uds == "/run/t/g.sock"
    assert parse_args(["--model", qwen2_dir])[0].uds is None
    render = "--content-parts-render-url"
    ok = parse_args(["--model", qwen2_dir, render, "unix:/run/t/r.sock"])[0]
    assert ok.content_parts_render_url == "unix:/run/t/r.sock"
    with pytest.raises(SystemExit):  # before any engine is built
        parse_args(["--model", qwen2_dir, render, "unix:r.sock"])
