"""run_server: two uvicorn workers from a factory, shared metrics, clean exit on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tandem_http import MULTIPROC_ENV

ROOT = Path(__file__).resolve().parents[3]

_LAUNCH = """
import sys
from tandem_http import run_server
run_server(
    "tests.unit.http.factory_app:create",
    host="127.0.0.1",
    port=int(sys.argv[1]),
    workers=2,
    env={"TANDEM_HTTP_TEST_GREETING": "hi"},
    log_level="info",
)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base, timeout=2.0) as c:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited early with code {proc.returncode}")
            try:
                if c.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"server not healthy within {timeout} s")


def _refusals_while_draining(base: str, until) -> list[httpx.Response]:
    """Answers to new /health and /hello requests sent while ``until`` (a future) runs."""
    answers: list[httpx.Response] = []
    paths = ("/health", "/hello")
    while not until.done() and len(answers) < 20:
        try:
            # A new connection each time: the worker holding the slow request is the one
            # still listening.
            answers.append(httpx.get(f"{base}{paths[len(answers) % 2]}", timeout=5))
        except httpx.TransportError:
            pass  # the idle worker closing its socket while the connection came in
        time.sleep(0.1)
    return answers


def test_two_workers_serve_and_stop_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    # mkdtemp inside the server lands here, so the test can see it cleaned up.
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    ok = False
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_healthy(proc, base)
        # A new connection per request, so that both workers get a share of them (the second
        # worker may still be starting when the first answers /health).
        pids: set[int] = set()
        hellos = 0
        while len(pids) < 2 and hellos < 300:
            if hellos:
                time.sleep(0.05)
            with httpx.Client(base_url=base, timeout=10.0) as c:
                r = c.get("/hello")
            assert r.status_code == 200
            assert r.json()["greeting"] == "hi"
            assert r.headers["x-request-id"]
            pids.add(r.json()["pid"])
            hellos += 1
        assert len(pids) == 2
        with httpx.Client(base_url=base, timeout=10.0) as c:
            missing = c.get("/nope")
            assert missing.status_code == 404
            assert missing.json()["error"]["type"] == "not_found"
            # Whichever worker answers, the counter is the sum over both.
            metrics = c.get("/metrics").text
            assert f"tandem_http_test_hellos_total {float(hellos)}" in metrics
        assert list(tmp_path.glob("tandem-metrics-*")) != []

        # Graceful shutdown: a request in flight when SIGTERM arrives still gets its answer,
        # and while it runs, new requests (health checks too) are refused with a typed 503.
        marker = tmp_path / "in-flight"
        params = {"marker": str(marker), "seconds": "4"}
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(httpx.get, f"{base}/slow", params=params, timeout=30)
            for _ in range(300):
                if marker.exists() or slow.done():
                    break
                time.sleep(0.05)
            assert marker.exists()
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)  # to the parent only, as an orchestrator does
            refusals = _refusals_while_draining(base, until=slow)
            answer = slow.result(timeout=30)
        assert answer.status_code == 200
        assert answer.json() == {"slow": "done"}
        # The supervisor passes the signal on within a tick; from then on, every answer is 503.
        first = next((i for i, r in enumerate(refusals) if r.status_code == 503), None)
        assert first is not None, "no new request was refused while the server drained"
        for r in refusals[first:]:
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "shutting_down"
        assert proc.wait(timeout=30) == 0
        # Drained as soon as the last request was answered, not after the whole grace period.
        assert time.monotonic() - signalled < 20
        assert list(tmp_path.glob("tandem-metrics-*")) == []
        ok = True
    finally:
        # The whole group: workers must not outlive a parent that failed to stop them.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if not ok:
            print(log_path.read_text(errors="replace"))


def _launch(port: int, factory: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != MULTIPROC_ENV}
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = _LAUNCH.replace("tests.unit.http.factory_app:create", factory)
    return subprocess.Popen(
        [sys.executable, "-c", code, str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def test_a_second_server_on_a_taken_port_is_refused(tmp_path: Path) -> None:
    # Workers listen with SO_REUSEPORT; without an exclusive claim a second server would
    # silently share the first one's traffic.
    port = _free_port()
    first = _launch(port, "tests.unit.http.factory_app:create", tmp_path)
    try:
        _wait_healthy(first, f"http://127.0.0.1:{port}")
        second = _launch(port, "tests.unit.http.factory_app:create", tmp_path)
        try:
            out, _ = second.communicate(timeout=60)
        finally:
            _stop(second)
        assert second.returncode == 1
        assert b"in use" in out
        # The first server still answers, alone.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as c:
            pids = {c.get("/hello").json()["pid"] for _ in range(20)}
        assert len(pids) <= 2
    finally:
        _stop(first)


def test_a_worker_that_cannot_start_is_given_up_on(tmp_path: Path) -> None:
    # A factory that fails at import: restarted with a growing delay (1, 2, 4, 8 s), then the
    # server exits instead of restarting it every second forever.
    port = _free_port()
    proc = _launch(port, "tests.unit.http.no_such_module:create", tmp_path)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 1
    assert b"giving up" in out
    delays = re.findall(rb"worker 0 \(pid \d+\) exited with \d+; restarting in (\d+) s", out)
    assert delays[:4] == [b"1", b"2", b"4", b"8"]


def _read_answer(sock: socket.socket) -> bytes:
    """One HTTP/1.1 answer (head and Content-Length body) from a kept-alive socket; b"" when
    the server has closed it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(4096)
    return head


def test_idle_connections_outlive_the_clients_keep_alive(tmp_path: Path) -> None:
    # httpx and the OpenAI SDK drop idle connections after 5 s; were the server to close at
    # the same moment (uvicorn's default), a request sent then would meet a reset.
    port = _free_port()
    proc = _launch(port, "tests.unit.http.factory_app:create", tmp_path)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}")
        ask = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(ask)
            assert _read_answer(sock).startswith(b"HTTP/1.1 200")
            time.sleep(7)
            sock.sendall(ask)
            assert _read_answer(sock).startswith(b"HTTP/1.1 200")
    finally:
        _stop(proc)


def test_render_leaves_the_engine_a_core_of_the_ones_it_may_use(monkeypatch):
    from tandem_http import usable_cores
    from tandem_render.settings import render_default_workers

    # The affinity mask (taskset, a cpuset) counts, not the host's cores.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 4, 5})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 4
    assert render_default_workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert render_default_workers() == 1


def test_a_newcomer_on_two_cores_gets_one_render_and_one_door_worker(monkeypatch):
    from tandem_front.settings import FrontSettings
    from tandem_render.settings import RenderSettings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert RenderSettings(model="m").workers == 1
    assert FrontSettings(model="m", render_urls=(), generate_urls=()).workers == 1
