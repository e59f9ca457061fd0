"""The fault suite, as processes: nodes killed, restarted and stopped with requests in flight,
a render worker killed, a media server that stalls. Each fault ends with nothing hung, every
request answered or refused with a typed error, and the service serving again.

(A client hanging up mid-stream, observed on the engine, is in test_generate_interop.py: it
needs the shared fleet's engine metrics.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from tandem_client import TandemClient
from tools.servers import ServerProcess, tandem_generate, tandem_render

from ..support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
TWO_IMAGES = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 1019, IMAGE_PAD, 1020, 82, 1018, 198]
TWO_IMAGES += [1017, 436, 198]
EXIT_WITHIN_S = 30
GREEDY = {"temperature": 0.0, "max_tokens": 8}


def engine_cores(pid: int) -> list[psutil.Process]:
    children = psutil.Process(pid).children(recursive=True)
    return [p for p in children if "EngineCore" in " ".join([p.name(), *p.cmdline()])]


def answered(server: ServerProcess, status: int = 200) -> int:
    """Generate requests the server answered with ``status`` (uvicorn's access log)."""
    line = f'"POST /inference/v1/generate HTTP/1.1" {status}'
    return server.log_text(tail=10**8).count(line)


def pending(server: ServerProcess) -> float:
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("tandem_generate_pending "):
            return float(line.split()[1])
    return 0.0


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def images_for(n: int, seed: int) -> list[list[bytes]]:
    return [[png_bytes(seed=seed + 2 * i), png_bytes(seed=seed + 2 * i + 1)] for i in range(n)]


class Restartable:
    """A generate server that a test may kill and start again on the same port."""

    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc

    def restart(self) -> None:
        self.proc.stop()
        self.proc = self.proc.restarted()
        self.proc.wait_healthy(timeout=300)


@pytest.fixture
def doomed_generate(fleet_servers, second_generate, weight_dir):
    """A fresh generate node at the fleet's weights. A router sends requests only to nodes that
    hold the fleet's newest update, and earlier tests updated the fleet (the GRPO example ends
    by loading the checkpoint's numbers back as an update): the fleet's nodes and this one take
    one more update of those numbers, so all hold the same one."""
    from safetensors.torch import load_file

    model, servers = fleet_servers
    with tandem_generate(model, weight_dir) as server:
        server.wait_healthy(timeout=300)
        nodes = [servers["generate"].url, second_generate.url, server.url]
        checkpoint = load_file(f"{model}/model.safetensors")
        with TandemClient(servers["render"].url, nodes, weight_dir=weight_dir) as client:
            client.update_weights(checkpoint, version="default")
        yield server


@pytest.fixture(scope="module")
def own_generate(fleet):
    """A generate server of this module's own (the fleet's must not be restarted)."""
    model, _ = fleet
    node = Restartable(tandem_generate(model))
    try:
        node.proc.wait_healthy(timeout=300)
        yield node
    finally:
        node.proc.stop()


def test_a_rollout_survives_a_generate_node_dying_mid_batch(fleet_servers, doomed_generate):
    model, servers = fleet_servers
    survivor = servers["generate"]
    cores = engine_cores(doomed_generate.proc.pid)
    assert cores, "the generate process has no engine-core child"
    killed_at: list[float] = []

    def kill_once_busy() -> None:
        # Kill while the node holds requests, so that they must move.
        deadline = time.monotonic() + 300
        while pending(doomed_generate) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        for core in cores:
            core.kill()
        killed_at.append(time.monotonic())

    prompts = 16
    survivor_before = answered(survivor)
    killer = threading.Thread(target=kill_once_busy)
    killer.start()
    with TandemClient(
        servers["render"].url, [survivor.url, doomed_generate.url], model=model, backoff_s=0.1
    ) as client:
        out = client.rollout(
            [TWO_IMAGES] * prompts,
            images_for(prompts, 700),
            n=2,
            max_tokens=16,
            temperature=1.0,
            progress=False,
        )
    finished_at = time.monotonic()
    killer.join()
    assert killed_at and killed_at[0] < finished_at, "the node died after the batch, not in it"
    assert len(out.completion_ids) == 2 * prompts
    assert all(1 <= len(c) <= 16 for c in out.completion_ids)
    # Every prompt was answered once: by the node before it died, or by the survivor.
    moved = answered(survivor) - survivor_before
    assert moved + answered(doomed_generate) == prompts
    # The node itself goes away with a failure status, so that compose/Kubernetes restart it.
    exit_code = doomed_generate.proc.wait(timeout=EXIT_WITHIN_S)
    assert exit_code == os.EX_SOFTWARE or zmq_aborted(doomed_generate, exit_code), (
        doomed_generate.log_text()
    )


def zmq_aborted(server: ServerProcess, exit_code: int) -> bool:
    """The process was aborted by libzmq's own assertion: vLLM's engine monitor thread closes
    the engine client's sockets while the event loop may still use them (seen once in many
    runs). Still a failure status, which is what the supervisors need."""
    return exit_code == -signal.SIGABRT and "(src/" in server.log_text(tail=2000)


def test_generate_restarted_with_requests_in_flight(fleet_servers, own_generate):
    model, servers = fleet_servers
    render = servers["render"].url
    prompts = 8
    held_images, fresh_images = images_for(prompts, 900), images_for(prompts, 950)
    batch = [TWO_IMAGES] * prompts
    # Client A sends its images once; the node holds them (A will send hashes only next time).
    with TandemClient(render, own_generate.proc.url, model=model) as a:
        first = a.rollout(batch, held_images, progress=False, **GREEDY)

        # The node is killed with a stream open on it and client B's batch under way, then
        # started again. The stream ends with a transport error (nothing hangs); B retries with
        # backoff for longer than a restart takes, and every request is answered once.
        # The engine is frozen first (vLLM's pause, mode keep), so that what the test sends is
        # still on the node at the kill however fast or slow the machine is: a stream that ran
        # before the pause ended before the kill on CI twice (once the engine outran B, once
        # the server's output lagged the engine until the stream was done).
        paused = httpx.post(
            f"{own_generate.proc.url}/pause",
            params={"mode": "keep", "clear_cache": "false"},
            timeout=30,
        )
        assert paused.status_code == 200, paused.text
        restarted: list[ServerProcess] = []
        stream_open = threading.Event()
        long_request = rendered_generate(render, model, seed=990, max_tokens=3900)

        def stream_until_cut() -> str:
            url = f"{own_generate.proc.url}/inference/v1/generate"
            try:
                with httpx.stream("POST", url, json=long_request, timeout=120) as r:
                    if r.status_code == 200:
                        stream_open.set()  # its answer has begun: the request is on the node
                    for _ in r.iter_lines():
                        pass
            except httpx.TransportError as exc:
                return type(exc).__name__
            return "finished"

        def kill_and_restart() -> None:
            # The stream and at least two of B's requests are held by the frozen engine.
            wait_until(lambda: pending(own_generate.proc) >= 3, 120, "B's requests on the node")
            os.killpg(own_generate.proc.proc.pid, signal.SIGKILL)
            own_generate.restart()
            restarted.append(own_generate.proc)

        with (
            TandemClient(
                render, own_generate.proc.url, model=model, max_retries=20, backoff_s=1.0
            ) as b,
            ThreadPoolExecutor(2) as pool,
        ):
            cut = pool.submit(stream_until_cut)
            assert stream_open.wait(120), "the stream was not answered"
            killer = pool.submit(kill_and_restart)
            second = b.rollout(batch, fresh_images, progress=False, **GREEDY)
            killer.result(timeout=300)
            assert cut.result(timeout=60) in ("RemoteProtocolError", "ReadError")
        assert restarted, "the node was not restarted during the batch"
        new = restarted[0]
        assert len(second.completion_ids) == prompts
        # The frozen node finished none of B's: each was answered once, by the new process.
        assert answered(new) == prompts

        # A greedy replay, one request at a time, gives the tokens B received.
        with TandemClient(render, new.url, model=model) as replay:
            for i in range(prompts):
                alone = replay.rollout([TWO_IMAGES], [fresh_images[i]], progress=False, **GREEDY)
                assert alone.completion_ids == [second.completion_ids[i]], i

        # A held items on the old process. Either it has seen the restart at its fleet poll
        # (tandem_client judges the fleet every fence_poll_s) and sends them whole, or it sends
        # hashes only, the new process answers 409 for what it lacks and A resends them: the
        # tokens are as before either way.
        third = a.rollout(batch, held_images, progress=False, **GREEDY)
    assert third.completion_ids == first.completion_ids


def rendered_generate(render: str, model: str, seed: int, max_tokens: int) -> dict:
    """A generate request (JSON) for one image that runs ``max_tokens`` steps, streamed."""
    body = chat_body(model, [data_url(png_bytes(seed=seed))], max_tokens=max_tokens)
    r = httpx.post(f"{render}/v1/chat/completions/render", json=body, timeout=60)
    assert r.status_code == 200, r.text
    request = r.json()
    request["sampling_params"].update(temperature=0.0, ignore_eos=True)
    request["stream"] = True
    return request


def test_sigterm_finishes_in_flight_requests_and_refuses_new_ones(fleet, own_generate):
    model, urls = fleet
    node = own_generate.proc
    url = f"{node.url}/inference/v1/generate"
    # Two requests are in flight at the SIGTERM. One is still uploading its body: it is held on
    # the server for as long as the test likes, so the drain has something to wait for however
    # fast the engine or slow the server is (a stream alone ended before the signal on CI once:
    # the server's output had lagged the engine until the stream was done).
    held = rendered_generate(urls["render"], model, seed=992, max_tokens=16)
    held_body = json.dumps({**held, "stream": False}).encode()
    upload_rest = threading.Event()

    def slow_upload() -> Iterator[bytes]:
        yield held_body[:100]
        upload_rest.wait(120)
        yield held_body[100:]

    def send_held() -> httpx.Response:
        headers = {"content-type": "application/json", "content-length": str(len(held_body))}
        return httpx.post(url, content=slow_upload(), headers=headers, timeout=120)

    # The other is a stream that is running, and goes on to its end (the server writes a
    # stream's tokens as they come, whether or not the client reads them).
    tokens = 2000
    request = rendered_generate(urls["render"], model, seed=991, max_tokens=tokens)
    received: list[int] = []
    with ThreadPoolExecutor(1) as pool:
        held_answer = pool.submit(send_held)
        try:
            # Admitted (before its body is read): the request is in the server.
            wait_until(lambda: pending(node) >= 1, 60, "the held request on the node")
            with httpx.stream("POST", url, json=request, timeout=120) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: {"):
                        received += json.loads(line[6:])["choices"][0]["token_ids"]
                        break  # the request is running on the engine
                signalled = time.monotonic()
                # To the server process, as an orchestrator does.
                node.proc.send_signal(signal.SIGTERM)
                wait_until(
                    lambda: httpx.get(f"{node.url}/health", timeout=5).status_code == 503,
                    10,
                    "the node to report it is draining",
                )
                refused = httpx.post(url, json={**request, "stream": False}, timeout=30)
                upload_rest.set()  # the held request sends the rest of its body, and runs
                for line in lines:  # the stream goes on to its end
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            received += choice["token_ids"] or []
        finally:
            upload_rest.set()
        answer = held_answer.result(timeout=120)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "shutting_down"
    assert len(received) == tokens
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["choices"][0]["token_ids"]) == 16
    assert node.proc.wait(timeout=EXIT_WITHIN_S) == 0, node.log_text()
    assert time.monotonic() - signalled < EXIT_WITHIN_S + 30


def render_workers(server: ServerProcess) -> set[int]:
    """The pids of the render server's worker processes (spawned children running uvicorn)."""
    children = psutil.Process(server.proc.pid).children()
    return {p.pid for p in children if "spawn_main" in " ".join(p.cmdline())}


@pytest.fixture(scope="module")
def two_worker_render(fleet):
    model, _ = fleet
    with tandem_render(model, workers=2) as server:
        server.wait_healthy(timeout=300)
        wait_until(lambda: len(render_workers(server)) == 2, 120, "two render workers")
        yield server


def test_a_killed_render_worker_is_replaced_and_its_requests_retried(fleet, two_worker_render):
    model, _ = fleet
    server = two_worker_render
    before = render_workers(server)
    requests = 40
    outcomes: list[object] = []

    def render_one(i: int) -> object:
        # A client per request: a new connection each time, so both workers take a share.
        with TandemClient(server.url, [], model=model, backoff_s=0.2, max_retries=5) as c:
            try:
                return c.render_chat(chat_body(model, [png_bytes(seed=1200 + i)])["messages"])
            except Exception as exc:  # noqa: BLE001 (any failure must be one of the client's)
                return exc

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(render_one, i) for i in range(requests)]
        wait_until(lambda: sum(f.done() for f in futures) >= 4, 120, "the load to start")
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        outcomes = [f.result(timeout=120) for f in futures]
    failures = [o for o in outcomes if isinstance(o, Exception)]
    # Retried on the surviving worker (or the replacement): every request got its answer.
    assert failures == [], failures[:3]
    wait_until(lambda: len(render_workers(server)) == 2, 120, "the worker's replacement")
    after = render_workers(server)
    assert victim not in after and len(after - before) == 1
    assert "restarting in" in server.log_text(tail=10**6)
    # Both workers serve: new connections keep being answered.
    for i in range(6):
        r = httpx.post(
            f"{server.url}/v1/chat/completions/render",
            json=chat_body(model, [data_url(png_bytes(seed=1300 + i))]),
            timeout=60,
        )
        assert r.status_code == 200


class StalledMediaServer:
    """A media server on 127.0.0.1 that accepts, sends its headers and a first byte, then
    stalls for as long as the connection stays open."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n\x89")
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            conn.close()


def test_a_stalled_media_server_times_out_and_others_are_served(fleet):
    model, _ = fleet
    stalled = StalledMediaServer()
    timeout_s = 5
    server = tandem_render(
        model, "--allowed-private-hosts", "127.0.0.1", "--media-fetch-timeout-s", str(timeout_s)
    )
    try:
        server.wait_healthy(timeout=300)
        url = f"http://127.0.0.1:{stalled.port}/photo.png"

        def render(image: str) -> tuple[float, httpx.Response]:
            start = time.monotonic()
            r = httpx.post(
                f"{server.url}/v1/chat/completions/render",
                json=chat_body(model, [image]),
                timeout=60,
            )
            return time.monotonic() - start, r

        assert render(data_url(png_bytes(seed=1399)))[1].status_code == 200  # warm
        with ThreadPoolExecutor(8) as pool:
            stuck = [pool.submit(render, url) for _ in range(4)]
            wait_until(lambda: stalled.accepted >= 4, 30, "the fetches to reach the server")
            # While four fetches hang, other requests are answered at once.
            others = [render(data_url(png_bytes(seed=1400 + i))) for i in range(4)]
            assert not any(f.done() for f in stuck), "a stalled fetch ended before its timeout"
            results = [f.result(timeout=60) for f in stuck]
        for _, r in others:
            assert r.status_code == 200
        for took, r in results:
            assert r.status_code == 422
            assert r.json()["error"]["type"] == "media_fetch_failed"
            assert timeout_s * 0.9 <= took < timeout_s + 10
        # The service is fine afterwards.
        took, r = render(data_url(png_bytes(seed=1410)))
        assert r.status_code == 200
    finally:
        server.stop()
        stalled.close()
