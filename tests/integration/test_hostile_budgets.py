"""The budgets of ``docs/budgets.md`` held by real processes against hostile clients: bodies
that trickle, bodies that inflate, media render must fetch and decode, render answers the
door must hold, and callers that never read their answers. Each drives one
input class past its budget, and a normal request is still served beside it.

Measured before these defences (the same servers): eight slow bodies kept render, generate and
the door answering 429 to everything for as long as they trickled; eight 2 KB bodies inflating
to the route's cap were all decoded, whatever the byte budget; callers that never read a render
answer (or a stream) held their slots for as long as they kept the connection open.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tools.hostile import (
    MediaServer,
    NonReaders,
    PeakRss,
    SlowBodies,
    concurrently,
    inflating_body,
    serve_time,
)
from tools.servers import ServerProcess, serving, tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

from ..support.images import chat_body, data_url, photo_jpeg, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

MIB = 1024 * 1024
PENDING = 8
BUDGET = 100 * MIB
TIMEOUT_S = 3
SEND_TIMEOUT_S = 3
LIMITS = [
    "--max-pending",
    str(PENDING),
    "--max-held-bytes",
    str(BUDGET),
    "--body-timeout-s",
    str(TIMEOUT_S),
    "--send-timeout-s",
    str(SEND_TIMEOUT_S),
]
CHAT_RENDER = "/v1/chat/completions/render"
GENERATE = "/inference/v1/generate"
ZSTD_JSON = {"content-type": "application/json", "content-encoding": "zstd"}


@pytest.fixture(scope="module")
def tiers() -> Iterator[dict[str, ServerProcess]]:
    model = str(ensure_model("qwen2-vl"))
    # Media may be fetched from this host only (the test's own media server); freed memory
    # goes back to the kernel, so the worker's RSS shows what its requests hold at once.
    render = tandem_render(
        model,
        *LIMITS,
        "--no-pretouch-cache-memory",
        "--allowed-private-hosts",
        "127.0.0.1",
    )
    generate = tandem_generate(model, None, *LIMITS)
    # The door starts with the rest: its /health answers once render's and generate's do.
    door = tandem_front(model, render.url, generate.url, *LIMITS)
    with serving([render, generate, door], timeout=600):
        yield {"render": render, "generate": generate, "door": door}


def normal(tiers: dict[str, ServerProcess], name: str) -> tuple[str, dict]:
    """A small request each tier serves: (url, JSON body)."""
    model = str(ensure_model("qwen2-vl"))
    if name == "generate":
        body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}}
        return f"{tiers[name].url}{GENERATE}", body
    return f"{tiers[name].url}{CHAT_RENDER}", chat_body(model, [])


@pytest.mark.parametrize("name", ["render", "generate", "door"])
def test_max_pending_slow_bodies_are_let_go_and_a_normal_request_is_served(tiers, name):
    url, body = normal(tiers, name)
    path = "/" + url.split("/", 3)[3]
    with SlowBodies(tiers[name].url, path, PENDING, every_s=0.5) as slow:
        # Every slot is held by a body that trickles (one byte each half second) ...
        refused = httpx.post(url, json=body, timeout=60)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["details"]["pending"] == PENDING
        # ... until the deadline lets them go.
        seconds, seen = serve_time(lambda: httpx.post(url, json=body, timeout=60), TIMEOUT_S + 5)
        assert seconds is not None, f"not served within {TIMEOUT_S + 5} s: {seen}"
        # The trickle reads an answer at its next beat: the normal request, served once the
        # deadline freed the slots, came back before any was read in a full run here (all None).
        wait_until(lambda: slow.holding == 0, TIMEOUT_S + 5)
    assert set(slow.statuses) <= {408, None}
    assert 408 in slow.statuses


def held_bytes(server: ServerProcess, name: str) -> float:
    """The process's own count of the bytes its admitted requests hold."""
    return gauge(server, name, "held_bytes")


def pending(server: ServerProcess, name: str) -> float:
    """The process's own count of the requests it holds."""
    return gauge(server, name, "pending")


def gauge(server: ServerProcess, name: str, metric: str) -> float:
    prefix = {"render": "tandem_render", "generate": "tandem_generate", "door": "tandem_front"}
    return metric_value(server, f"{prefix[name]}_{metric}")


def metric_value(server: ServerProcess, metric: str) -> float:
    """A metric's value (summed over its labels)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    lines = [x for x in text.splitlines() if x.startswith((f"{metric} ", f"{metric}{{"))]
    assert lines, f"{metric} not on {server.url}/metrics"
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines)


# (served by, route, decoded MiB; holders: route, count, MiB declared each): the holders' slow
# bodies keep the budget's room under one decoded body while the eight are posted.
COMPRESSED = {
    "render": ("render", CHAT_RENDER, 60, (CHAT_RENDER, 1, 50)),
    "generate": ("generate", GENERATE, 25, (GENERATE, 3, 25)),
    "door-generate": ("door", GENERATE, 25, (CHAT_RENDER, 2, 40)),
    # The door charges the document it parses from the chat body as much again.
    "door-chat": ("door", "/v1/chat/completions", 40, (CHAT_RENDER, 2, 32)),
}


@pytest.mark.parametrize("case", list(COMPRESSED))
def test_compressed_bodies_are_held_within_the_byte_budget(tiers, case):
    # Eight bodies of a few KB, each inflating past the room the budget has left: each was
    # charged its wire size and inflated whole (eight 26 MiB bodies on generate were all held
    # against 100 MiB); now each is refused from its frame's header, nothing inflated.
    name, path, mib, (holder_path, holders, holder_mib) = COMPRESSED[case]
    server = tiers[name]
    _, body = normal(tiers, "generate" if path == GENERATE else "render")
    frame, size = inflating_body(body, mib * MIB)
    assert len(frame) < 64 * 1024

    def post() -> int:
        url = f"{server.url}{path}"
        return httpx.post(url, content=frame, headers=ZSTD_JSON, timeout=120).status_code

    slow = SlowBodies(server.url, holder_path, holders, declared=holder_mib * MIB, every_s=0.5)
    with slow:
        wait_until(lambda: held_bytes(server, name) >= holders * holder_mib * MIB)
        with PeakRss(server.proc.pid) as rss, concurrently([post] * 8) as statuses:
            pass
        assert slow.holding == holders, "a holder was let go before the bodies were posted"
    assert statuses == [429] * 8
    assert rss.growth < 32 * MIB, rss.growth >> 20
    # Alone, one fits: it was the room, not the body.
    assert post() in (200, 400)
    normal_url, normal_body = normal(tiers, name)
    assert httpx.post(normal_url, json=normal_body, timeout=60).status_code == 200


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)


def test_renders_answers_are_held_within_the_doors_budget(tiers):
    # Twelve distinct images a chat (3072 of the 4096 tokens): render's answer (their items,
    # ~14 MB) is charged to the door request as it arrives, so eight at once never hold more
    # than the door's budget.
    model = str(ensure_model("qwen2-vl"))
    door = tiers["door"]

    def post(seed: int) -> int:
        images = [data_url(png_bytes(448, 448, seed=seed * 100 + i)) for i in range(12)]
        body = {**chat_body(model, images), "max_tokens": 1}
        return httpx.post(f"{door.url}/v1/chat/completions", json=body, timeout=300).status_code

    with (
        PeakRss(door.proc.pid) as rss,
        concurrently([lambda s=s: post(s) for s in range(8)]) as statuses,
    ):
        pass
    assert set(statuses) <= {200, 413, 429}, statuses
    assert rss.growth < BUDGET + 64 * MIB, rss.growth >> 20
    url, body = normal(tiers, "door")
    assert httpx.post(url, json=body, timeout=60).status_code == 200


def noise_png(side: int, seed: int) -> bytes:
    """A PNG of seeded noise: as large on the wire as decoded (side x side x 3 bytes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def test_fetched_media_are_held_within_the_workers_budget(tiers):
    # Eight chats at once (every slot), three URLs each of 2048x2048 noise (12 MiB fetched and
    # 12 MiB decoded apiece, 72 MiB a chat), resized to 448x448 for the model. The fetches are
    # charged their Content-Length before a byte is read and the decodes their size from the
    # headers before any is decoded, so the worker holds at most a budget of media, and
    # copies of them that are not charged (a fetch's bytes joined into one, the processor's
    # copy of a decoded image): measured +167-204 MiB, under the 2.5 budgets docs/budgets.md
    # states. Without the byte budget all eight were served at once: +375 MiB.
    model = str(ensure_model("qwen2-vl"))
    render = tiers["render"]
    side, per_chat, chats = 2048, 3, PENDING
    files = {f"/{i}.png": noise_png(side, seed=i) for i in range(per_chat * (chats + 1))}

    def post(urls: list[str]) -> int:
        body = {**chat_body(model, urls), "mm_processor_kwargs": {"max_pixels": 448 * 448}}
        return httpx.post(f"{render.url}{CHAT_RENDER}", json=body, timeout=300).status_code

    with MediaServer(files) as media:
        chat_urls = [
            [media.url(f"/{c * per_chat + i}.png") for i in range(per_chat)]
            for c in range(chats + 1)
        ]
        assert post(chat_urls[-1]) == 200  # alone, one fits (and the worker is warm)
        with (
            PeakRss(render.proc.pid) as rss,
            concurrently([lambda u=u: post(u) for u in chat_urls[:chats]]) as statuses,
        ):
            pass
        assert set(statuses) <= {200, 429}, statuses
        # Two chats' media pass the budget: most are told to retry, not all.
        assert statuses.count(429) >= chats // 2, statuses
        assert 200 in statuses, statuses
        assert rss.growth < BUDGET * 5 // 2, rss.growth >> 20
        wait_until(lambda: held_bytes(render, "render") == 0)  # every byte came back
    url, body = normal(tiers, "render")
    assert httpx.post(url, json=body, timeout=60).status_code == 200


@pytest.mark.parametrize("name", ["render", "door"])
def test_callers_that_never_read_their_answers_are_cut_and_a_normal_request_is_served(tiers, name):
    # 64 connections post a render of three 720p photos and never read the answer: the
    # first PENDING hold every slot with writes blocked on TCP flow control (the rest get
    # 429). Without a send deadline they held them for as long as they stayed connected.
    model = str(ensure_model("qwen2-vl"))
    server = tiers[name]
    images = [data_url(photo_jpeg(seed), "image/jpeg") for seed in range(3)]
    photos = json.dumps(chat_body(model, images)).encode()
    url, body = normal(tiers, name)
    answer = httpx.post(f"{server.url}{CHAT_RENDER}", content=photos, timeout=120)
    assert answer.status_code == 200, answer.text
    assert len(answer.content) > 4 * MIB  # past what the socket buffers take unread
    # The tiers whose slots the callers hold, by the name their metrics go under.
    holders = {name: server} | ({"render": tiers["render"]} if name == "door" else {})
    with NonReaders(server.url, CHAT_RENDER, 64, photos) as unread:
        wait_until(lambda: pending(server, name) == PENDING, timeout_s=60)
        refused = httpx.post(url, json=body, timeout=60)
        assert refused.status_code == 429, refused.text
        seconds, seen = serve_time(
            lambda: httpx.post(url, json=body, timeout=60), SEND_TIMEOUT_S + 5
        )
        assert seconds is not None, f"not served within {SEND_TIMEOUT_S + 5} s: {seen}"
        # The slots (and their bytes) came back while those callers are still connected.
        for holder_name, holder in holders.items():
            wait_until(lambda h=holder, n=holder_name: pending(h, n) == 0, timeout_s=10)
            assert held_bytes(holder, holder_name) == 0
        assert unread.cut() >= PENDING
        assert set(unread.statuses()) <= {200, 429, None}


@pytest.mark.parametrize("name", ["generate", "door"])
def test_a_stream_nobody_reads_is_cut_and_its_engine_request_aborted(tiers, name):
    # A streamed answer whose caller stopped reading: its writes wait on TCP flow control
    # while the engine keeps generating. The engine is then paused (keep) to hold the request
    # unfinished; the send deadline must cut the stream and abort the engine request (before,
    # the stream waited for ever, its slot held).
    model = str(ensure_model("qwen2-vl"))
    server, generate = tiers[name], tiers["generate"]
    n, top = 8, 20
    if name == "generate":
        path = GENERATE
        request = {"token_ids": [1017, 82, 88], "stream": True}
        sampling = {"n": n, "logprobs": top, "ignore_eos": True, "temperature": 1.0}

        def body(max_tokens: int) -> dict:
            return {**request, "sampling_params": {**sampling, "max_tokens": max_tokens}}
    else:
        path = "/v1/chat/completions"
        chat = {
            "model": model,
            "messages": [{"role": "user", "content": "Count."}],
            "stream": True,
            "n": n,
            "logprobs": True,
            "top_logprobs": top,
            "ignore_eos": True,
            "temperature": 1.0,
        }

        def body(max_tokens: int) -> dict:
            return {**chat, "max_tokens": max_tokens}

    # Bytes the stream carries per engine step, from a short one read whole.
    steps = 16
    short = httpx.post(f"{server.url}{path}", json=body(steps), timeout=120)
    assert short.status_code == 200, short.text
    per_step = len(short.content) / steps
    # Steps after which the socket buffers (a few MB on loopback) and the server's own
    # buffer are surely full, and the room the context leaves past them.
    fill_steps = math.ceil(8 * MIB / per_step)
    max_tokens = 4096 - 64
    assert fill_steps * 2 < max_tokens, (per_step, fill_steps)

    def tokens() -> float:
        return metric_value(generate, "vllm:generation_tokens_total")

    wait_until(lambda: pending(generate, "generate") == 0)
    before = tokens()
    paused = False
    try:
        with NonReaders(server.url, path, 1, json.dumps(body(max_tokens)).encode()) as unread:
            wait_until(lambda: tokens() > before, timeout_s=120)  # it runs
            # Past the buffers (or already cut: a slow engine may not get that far within
            # the deadline, which is the point).
            wait_until(
                lambda: tokens() - before >= fill_steps * n or pending(generate, "generate") == 0,
                timeout_s=300,
            )
            keep = {"mode": "keep", "clear_cache": "false"}
            r = httpx.post(f"{generate.url}/pause", params=keep, timeout=60)
            assert r.status_code == 200, r.text
            paused = True
            assert tokens() - before < max_tokens * n, "the stream finished before the pause"
            # Cut within the deadline: the engine request let go while the caller is still
            # connected.
            wait_until(lambda: pending(generate, "generate") == 0, SEND_TIMEOUT_S + 10)
            wait_until(lambda: pending(server, name) == 0, SEND_TIMEOUT_S + 10)
            assert unread.cut() == 1
    finally:
        if paused:
            assert httpx.post(f"{generate.url}/resume", timeout=60).status_code == 200
    # Resumed, the engine runs only a short probe: one still holding the stream's request
    # would schedule it in the probe's steps.
    probe_tokens = 8
    before = tokens()
    probe = {
        "token_ids": [1017, 82, 88],
        "sampling_params": {"max_tokens": probe_tokens, "ignore_eos": True},
    }
    r = httpx.post(f"{generate.url}{GENERATE}", json=probe, timeout=120)
    assert r.status_code == 200, r.text
    assert tokens() - before == probe_tokens
    assert metric_value(generate, "vllm:num_requests_running") == 0
