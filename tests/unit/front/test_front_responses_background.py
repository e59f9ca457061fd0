"""The door's Responses store and background mode held to account (issue 43): a background
stream is answered as ``vllm serve`` answers it; a background response whose generate hop is
refused ends ``failed`` with the refusal's error (its stream too); background responses are
held against the worker's admission until they end, bounded in number (429 past it); each
stored response is its tenant's, and each tenant's store is bounded by the bytes it holds (its
oldest finished responses evicted, never another tenant's nor a running one)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import time
import tracemalloc
from typing import Any

import httpx
import msgspec
import pytest

from tandem_front.app import create_app
from tests.support.asgi import app_client
from tools.hostile import PeakRss

from .conftest import door_settings
from .test_front_answers import Pair, ended, sse, streamed, whole
from .test_front_responses import ASK, text_of

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


def store_on(model_dir: str, **kw: Any):
    """vLLM's answer side with the Responses store on (``kw``: door settings)."""
    from tandem_front.vllm_answers import VllmAnswers

    os.environ["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
    try:
        return VllmAnswers(door_settings(model_dir, **kw))
    finally:
        del os.environ["VLLM_ENABLE_RESPONSES_API_STORE"]


@pytest.fixture(scope="module")
def stored(model_dir):
    return store_on(model_dir)


class Held(Pair):
    """``Pair`` whose generate answers once ``release`` is set (``asked``: requests it got)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()
        self.asked = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "r1" and request.method == "POST":
            self.asked += 1
            await self.release.wait()
        return await super().handle_async_request(request)


def refusing(status: int, type_: str) -> Any:
    error = {"message": f"refused: {type_}", "type": type_, "code": status}
    return lambda gen: httpx.Response(status, json={"error": error})


class Unreachable(Pair):
    """``Pair`` whose generate node refuses connections (no node serves)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "r1" and request.method == "POST":
            raise httpx.ConnectError("refused", request=request)
        return await super().handle_async_request(request)


async def settled(
    c: httpx.AsyncClient, rid: str, headers: dict[str, str] | None = None, seconds: float = 30
) -> dict[str, Any]:
    """The stored response once it is no longer queued (asked again for up to ``seconds``:
    a bound for a run that never ends, not a measure of one that does)."""
    deadline = time.monotonic() + seconds
    while True:
        answer = (await c.get(f"/v1/responses/{rid}", headers=headers)).json()
        if answer["status"] not in ("queued", "in_progress") or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.01)


# -- 1. background + stream ----------------------------------------------------------------


async def test_a_background_stream_is_answered_with_its_runs_events(stored, tokenizer):
    # Before: 500 internal_error every time (the stream was read before its run had begun).
    tokens = ended(tokenizer, "hello there")
    chunks = [[{"index": 0, "token_ids": [x]}] for x in tokens[:-1]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    t = Pair(streamed(*chunks))
    body = {**ASK, "background": True, "stream": True}
    app = create_app(door_settings("m"), stored, t)
    async with app_client(app) as c:
        r = await c.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        sent = sse(r.content)
        kinds = [k for k, _ in sent]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
        assert [d["sequence_number"] for _, d in sent] == list(range(len(sent)))
        rid = sent[-1][1]["response"]["id"]
        assert text_of(sent[-1][1]["response"]) == "hello there"
        # Stored, and its events read again from any point, as vllm serve keeps them.
        assert (await c.get(f"/v1/responses/{rid}")).json()["status"] == "completed"
        again = await c.get(f"/v1/responses/{rid}", params={"stream": "true", "starting_after": 1})
        assert [k for k, _ in sse(again.content)] == kinds[2:]


# -- 2. a refused background response ends failed --------------------------------------------


REFUSALS = {
    "429": lambda: Pair(refusing(429, "overloaded")),
    "503": lambda: Pair(refusing(503, "upstream_unavailable")),
    "no serving node": lambda: Unreachable(whole()),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_refused_background_response_ends_failed_with_the_refusals_error(stored, refusal):
    # Before: it stayed queued for ever (the refusal was no error vLLM's run handles).
    app = create_app(door_settings("m"), stored, REFUSALS[refusal]())
    async with app_client(app) as c:
        queued = (await c.post("/v1/responses", json={**ASK, "background": True})).json()
        assert queued["status"] == "queued"
        answer = await settled(c, queued["id"], seconds=5)
    assert answer["status"] == "failed"
    expected = {"429": "overloaded", "503": "upstream_unavailable"}.get(refusal)
    assert answer["error"]["code"] == (expected or "upstream_unavailable")
    assert answer["error"]["message"]


async def test_a_refused_background_stream_ends_with_an_error_event(stored):
    # Before: the stream (and any reader of it) waited for ever for its last event.
    app = create_app(door_settings("m"), stored, Pair(refusing(429, "overloaded")))
    async with app_client(app) as c:
        body = {**ASK, "background": True, "stream": True}
        r = await asyncio.wait_for(c.post("/v1/responses", json=body), 30)
        assert r.status_code == 200
        sent = sse(r.content)
        assert [k for k, _ in sent] == ["response.created", "response.in_progress", "error"]
        assert sent[-1][1]["code"] == "overloaded"
        assert sent[-1][1]["sequence_number"] == 2
        rid = sent[0][1]["response"]["id"]
        again = await asyncio.wait_for(c.get(f"/v1/responses/{rid}", params={"stream": "true"}), 30)
        assert [k for k, _ in sse(again.content)] == [k for k, _ in sent]
        assert (await c.get(f"/v1/responses/{rid}")).json()["status"] == "failed"


class FirstRefused:
    """A generate answer: the first request refused (429), every later one ``then``'s."""

    def __init__(self, then: Any) -> None:
        self.then = then
        self.asked = 0

    def __call__(self, gen: Any) -> httpx.Response:
        self.asked += 1
        return refusing(429, "overloaded")(gen) if self.asked == 1 else self.then(gen)


async def test_a_reused_request_id_streams_its_new_run_not_the_old_ones(stored, tokenizer):
    # Before: the second run's stream replayed the first (failed) run's events.
    tokens = ended(tokenizer, "hello there")
    chunks = [[{"index": 0, "token_ids": tokens[:-1]}]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    app = create_app(door_settings("m"), stored, Pair(FirstRefused(streamed(*chunks))))
    body = {**ASK, "background": True, "stream": True, "request_id": "reused-id"}
    async with app_client(app) as c:
        first = sse((await asyncio.wait_for(c.post("/v1/responses", json=body), 30)).content)
        assert [k for k, _ in first][-1] == "error"
        second = sse((await asyncio.wait_for(c.post("/v1/responses", json=body), 30)).content)
    kinds = [k for k, _ in second]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert text_of(second[-1][1]["response"]) == "hello there"


# -- 3. background responses are held and bounded --------------------------------------------


async def runs_ended(c: httpx.AsyncClient, seconds: float = 60) -> bool:
    """Whether the worker holds no request (its runs let go once their tasks end, just
    after their answers are stored), asked again for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (await c.get("/load")).json()["server_load"]:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def gauge(c: httpx.AsyncClient, name: str) -> int:
    text = (await c.get("/metrics")).text
    return int(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)))


async def test_background_responses_are_held_until_they_end_and_bounded(stored, tokenizer):
    # Before: a background response let go of its place and bytes once it was queued, and
    # any number of them ran.
    t = Held(whole({"index": 0, "token_ids": ended(tokenizer, "ok"), "finish_reason": "stop"}))
    app = create_app(door_settings("m", max_background_responses=2), stored, t)
    body = {**ASK, "background": True}
    async with app_client(app) as c:
        first, second = [(await c.post("/v1/responses", json=body)).json() for _ in range(2)]
        assert first["status"] == second["status"] == "queued"
        refused = await c.post("/v1/responses", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["details"]["max_background_responses"] == 2
        # Each run holds a place and the document parsed from its body (its request is gone).
        assert (await c.get("/load")).json()["server_load"] == 2
        assert await gauge(c, "tandem_front_held_bytes") >= 2 * len(json.dumps(body))
        t.release.set()
        for answer in (first, second):
            assert (await settled(c, answer["id"]))["status"] == "completed"
        assert await runs_ended(c)
        assert await gauge(c, "tandem_front_held_bytes") == 0
        assert (await c.post("/v1/responses", json=body)).json()["status"] == "queued"


COUNT = 200
IMAGE = 20 * MIB
BUDGET = 512 * MIB


async def test_200_background_responses_with_20_mb_images_stay_within_the_budget(
    model_dir, tokenizer
):
    """Past the bound, 429; the worker holds what it admitted and no more: its RSS stays
    within --max-held-bytes + 100 MiB (the store's budget as large: the runs' inputs it
    keeps are what admission holds, and admission is what refuses here)."""
    answers = store_on(model_dir, responses_store_bytes=BUDGET)
    t = Held(whole({"index": 0, "token_ids": ended(tokenizer, "ok"), "finish_reason": "stop"}))
    settings = door_settings("m", max_background_responses=16, max_held_bytes=BUDGET)
    app = create_app(settings, answers, t)
    image = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * IMAGE}
    content = [image, {"type": "input_text", "text": "What is this?"}]
    body = msgspec.json.encode(
        {"input": [{"role": "user", "content": content}], "background": True}
    )
    statuses = []
    async with app_client(app) as c:
        with PeakRss(os.getpid()) as rss:
            for _ in range(COUNT):
                r = await c.post("/v1/responses", content=body)
                statuses.append(r.status_code)
        assert statuses.count(200) == 16 and statuses.count(429) == COUNT - 16, statuses
        assert rss.growth < BUDGET + 100 * MIB, rss.growth >> 20
        assert t.asked == 16
        t.release.set()
        assert await runs_ended(c)
        assert await gauge(c, "tandem_front_held_bytes") == 0


# -- 4. the store: bounded, and each response its tenant's ----------------------------------


async def test_the_oldest_stored_responses_are_evicted_past_the_stores_bytes(model_dir, tokenizer):
    # Before: every stored response (its input with it) was kept for ever.
    answers = store_on(model_dir, responses_store_bytes=30_000)  # each holds ~14 KB
    t = Pair(whole({"index": 0, "token_ids": ended(tokenizer, "ok"), "finish_reason": "stop"}))
    app = create_app(door_settings("m"), answers, t)
    body = {**ASK, "input": "x" * 5000}
    async with app_client(app) as c:
        ids = [(await c.post("/v1/responses", json=body)).json()["id"] for _ in range(3)]
        found = [(await c.get(f"/v1/responses/{rid}")).status_code for rid in ids]
    assert found == [404, 200, 200]
    assert answers.responses_serving.store.held <= 30_000


KEYS = {"a": {"authorization": "Bearer key-a"}, "b": {"authorization": "Bearer key-b"}}


async def test_another_keys_stored_response_is_as_unknown(stored, tokenizer):
    # Before: any key read, cancelled, continued or overwrote any other's.
    t = Held(whole({"index": 0, "token_ids": ended(tokenizer, "mine"), "finish_reason": "stop"}))
    settings = door_settings("m", api_key="key-a", admin_api_key=("key-b",))
    app = create_app(settings, stored, t)
    async with app_client(app) as c:
        post = {**ASK, "background": True}
        mine = (await c.post("/v1/responses", json=post, headers=KEYS["a"])).json()
        rid = mine["id"]
        unknown = await c.get("/v1/responses/resp_unknown", headers=KEYS["b"])
        attempts = [
            await c.get(f"/v1/responses/{rid}", headers=KEYS["b"]),
            await c.post(f"/v1/responses/{rid}/cancel", headers=KEYS["b"]),
            await c.post(
                "/v1/responses", json={**ASK, "previous_response_id": rid}, headers=KEYS["b"]
            ),
            await c.post("/v1/responses", json={**ASK, "request_id": rid}, headers=KEYS["b"]),
        ]
        for answer in attempts:
            assert answer.status_code == 404, answer.text
            assert answer.json() == json.loads(unknown.text.replace("resp_unknown", rid))
        t.release.set()
        answer = await settled(c, rid, KEYS["a"])
        assert answer["status"] == "completed" and text_of(answer) == "mine"
        follow = {**ASK, "previous_response_id": rid}
        assert (await c.post("/v1/responses", json=follow, headers=KEYS["a"])).status_code == 200
    assert t.asked == 2  # B's attempts reached no node


BIG = {**ASK, "input": "x" * 20_000}
"""A request whose stored response holds ~29 KB (its input messages and its answer)."""


async def test_a_keys_stored_responses_evict_only_its_own(model_dir, tokenizer):
    # Before: one oldest-first list across keys: B's responses evicted A's.
    answers = store_on(model_dir, responses_store_bytes=60_000)  # two of them per key
    t = Pair(whole({"index": 0, "token_ids": ended(tokenizer, "ok"), "finish_reason": "stop"}))
    settings = door_settings("m", api_key="key-a", admin_api_key=("key-b",))
    async with app_client(create_app(settings, answers, t)) as c:
        posted = [(await c.post("/v1/responses", json=BIG, headers=KEYS[k]), k) for k in "abbb"]
        found = [
            (await c.get(f"/v1/responses/{r.json()['id']}", headers=KEYS[k])).status_code
            for r, k in posted
        ]
    assert found == [200, 404, 200, 200]  # A's, then B's oldest evicted by its own


class HeldIds(Pair):
    """``Pair`` whose generate answers the request of each ``held`` id once ``release[id]``
    is set (any other at once)."""

    def __init__(self, answer: Any, *held: str) -> None:
        super().__init__(answer)
        self.release = {rid: asyncio.Event() for rid in held}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "r1" and request.method == "POST":
            gen = msgspec.msgpack.decode(await request.aread())
            for rid, release in self.release.items():
                if str(gen["request_id"]).startswith(rid):
                    await release.wait()
        return await super().handle_async_request(request)


async def test_a_running_response_is_never_evicted(model_dir, tokenizer):
    # Before: a background run still going was evicted as the oldest (its answer dropped:
    # 404, nothing to cancel), and nothing bounded what running responses held.
    # Two queued runs of BIG (~25 KB each) fill it.
    answers = store_on(model_dir, responses_store_bytes=45_000)
    ok = whole({"index": 0, "token_ids": ended(tokenizer, "ok"), "finish_reason": "stop"})
    t = HeldIds(ok, "held-1", "held-2")
    running = {**BIG, "background": True}
    async with app_client(create_app(door_settings("m"), answers, t)) as c:
        try:
            first = await c.post("/v1/responses", json={**running, "request_id": "held-1"})
            assert first.json()["status"] == "queued"
            finished = [(await c.post("/v1/responses", json=BIG)).json()["id"] for _ in "12"]
            assert (await c.get("/v1/responses/held-1")).json()["status"] == "queued"
            evicted = await c.get(f"/v1/responses/{finished[0]}")
            assert evicted.status_code == 404  # the oldest finished one, in its place
            second = await c.post("/v1/responses", json={**running, "request_id": "held-2"})
            assert second.json()["status"] == "queued"
            # The two runs alone hold the budget: a new stored response waits for one to end.
            refused = await c.post("/v1/responses", json=BIG)
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["type"] == "overloaded"
            assert error["details"]["responses_store_bytes"] == 45_000
            assert error["details"]["running_stored_bytes"] >= 45_000
            unstored = await c.post("/v1/responses", json={**BIG, "store": False})
            assert unstored.status_code == 200
            for rid in ("held-1", "held-2"):  # each read once it ends (then evictable)
                t.release[rid].set()
                answer = await settled(c, rid)
                assert answer["status"] == "completed" and text_of(answer) == "ok"
        finally:
            for release in t.release.values():
                release.set()


async def test_the_store_counts_the_bytes_it_holds(model_dir, tokenizer):
    """A background stream's kept events are most of what it holds: ~1 KB of objects each,
    ~150 bytes of JSON. Counted as held, the budget bounds the memory the store keeps."""
    # Before: their JSON lengths were counted, a seventh of what was held: here the store
    # kept all ten, 786 KB, counted as 111 KB against a 200 KB budget.
    budget = 200_000
    answers = store_on(model_dir, responses_store_bytes=budget)
    tokens = ended(tokenizer, "hello " * 12)
    chunks = [[{"index": 0, "token_ids": [x]}] for x in tokens[:-1]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    t = Pair(streamed(*chunks))
    body = {**ASK, "background": True, "stream": True}
    store = answers.responses_serving.store
    async with app_client(create_app(door_settings("m"), answers, t)) as c:
        # What a first request allocates once, allocated before memory is traced.
        warm = {**ASK, "stream": True, "store": False}
        assert (await c.post("/v1/responses", json=warm)).status_code == 200
        gc.collect()
        tracemalloc.start()
        try:
            for _ in range(10):  # ~70 KB each
                assert (await c.post("/v1/responses", json=body)).status_code == 200
            assert await runs_ended(c)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    # What it counts is what it keeps (give or take the door's own leftovers of the
    # requests, and objects the events share), so its budget bounds what it keeps.
    assert 0 < store.held <= budget
    assert 0.6 * store.held < kept < 1.5 * store.held, (kept, store.held)
