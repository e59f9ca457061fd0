"""One request of many small-on-the-wire, huge-when-decoded images, against a real render
process: refused from its headers, fast, without the worker's memory growing.

Measured before the per-request budget: 16 single-colour 8000x8000 PNGs (3.2 MB in all) made
a worker grow by 10.5 GB and answer 400 after 49 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tools.hostile import PeakRss
from tools.servers import ServerProcess, tandem_render
from tools.tiny_models import ensure_model

from ..support.fuzz import solid_pngs
from ..support.images import chat_body, data_url, png_bytes
from .test_faults import render_workers

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

CHAT = "/v1/chat/completions/render"
MB = 1024 * 1024


@pytest.fixture(scope="module")
def render_server() -> Iterator[ServerProcess]:
    with tandem_render(str(ensure_model("qwen2-vl"))) as server:
        server.wait_healthy(timeout=300)
        yield server


def huge_images_request(server: ServerProcess, count: int) -> tuple[httpx.Response, float, int]:
    """The measured request with ``count`` images: its answer, seconds to answer, and the
    worker's peak RSS growth in bytes (after a normal request has warmed the worker)."""
    model = str(ensure_model("qwen2-vl"))
    images = [data_url(p) for p in solid_pngs(8000, count)]
    with httpx.Client(base_url=server.url, timeout=300) as client:
        warm = client.post(CHAT, json=chat_body(model, [data_url(png_bytes(448, 448))]))
        assert warm.status_code == 200, warm.text
        # A one-worker server renders in its own process; more are spawned children.
        (worker,) = render_workers(server) or {server.proc.pid}
        body = chat_body(model, images)
        with PeakRss(worker) as rss:
            start = time.perf_counter()
            r = client.post(CHAT, json=body)
            seconds = time.perf_counter() - start
    return r, seconds, rss.growth


def test_sixteen_huge_single_colour_images_are_refused_fast_and_small(render_server):
    r, seconds, growth = huge_images_request(render_server, 16)
    print(f"16 x 8000x8000 PNG: {r.status_code} in {seconds:.3f} s, worker +{growth / MB:.0f} MB")
    assert r.status_code in (400, 413), r.text
    assert r.json()["error"]["type"] in ("media_too_large", "prompt_too_long")
    assert seconds < 10.0, "was 49 s before the budget"
    assert growth < 500 * MB, "was 10.5 GB before the budget"
    # The worker keeps serving.
    model = str(ensure_model("qwen2-vl"))
    ok = httpx.post(f"{render_server.url}{CHAT}", json=chat_body(model, [data_url(png_bytes())]))
    assert ok.status_code == 200, ok.text
