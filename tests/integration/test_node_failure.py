"""A generate node whose engine dies stops (so a supervisor restarts it), and the client moves
that node's work to another generate node mid-rollout."""

from __future__ import annotations

import os
import threading
import time

import httpx
import psutil
import pytest

from tandem_client import TandemClient
from tools.servers import tandem_generate

from ..support.images import png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
TWO_IMAGES = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 1019, IMAGE_PAD, 1020, 82, 1018, 198]
TWO_IMAGES += [1017, 436, 198]
EXIT_WITHIN_S = 30


@pytest.fixture
def doomed_generate(fleet):
    model, _ = fleet
    server = tandem_generate(model)
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()


def engine_cores(pid: int) -> list[psutil.Process]:
    children = psutil.Process(pid).children(recursive=True)
    return [p for p in children if "EngineCore" in " ".join([p.name(), *p.cmdline()])]


def answered(server) -> int:
    """Generate requests the server answered with 200 (uvicorn's access log)."""
    return server.log_text(tail=10**8).count('"POST /inference/v1/generate HTTP/1.1" 200')


def pending(server) -> float:
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("tandem_generate_pending "):
            return float(line.split()[1])
    return 0.0


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
    images = [[png_bytes(seed=700 + 2 * i), png_bytes(seed=701 + 2 * i)] for i in range(prompts)]
    killer = threading.Thread(target=kill_once_busy)
    killer.start()
    with TandemClient(
        servers["render"].url, [survivor.url, doomed_generate.url], model=model, backoff_s=0.1
    ) as client:
        out = client.rollout(
            [TWO_IMAGES] * prompts, images, n=2, max_tokens=16, temperature=1.0, progress=False
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
    assert exit_code == os.EX_SOFTWARE, doomed_generate.log_text()
