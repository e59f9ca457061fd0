"""Pause and resume with requests in flight, in each of vLLM 0.32's modes, on the real engine;
and the gate on state-changing control routes."""

from __future__ import annotations

import asyncio

import pytest

from ...support.asgi import app_client
from .helpers import generate_app, post, render, tokens
from .test_weight_updates import perturbed, push, restored, save

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

LONG = {"temperature": 0.0, "max_tokens": 600, "ignore_eos": True}


@pytest.fixture
def app(qwen2_engine, qwen2_dir, tmp_path):
    return generate_app(
        qwen2_engine, qwen2_dir, enable_control_routes=True, weight_transfer_dir=str(tmp_path)
    )


async def in_flight(engine, count: int) -> None:
    """Until ``count`` requests are in the engine and have sampled tokens."""
    states = engine.llm.output_processor.request_states

    def sampled(s) -> bool:
        return s.detokenizer is not None and s.detokenizer.num_output_tokens() > 0

    while not (len(states) >= count and all(sampled(s) for s in states.values())):
        await asyncio.sleep(0.01)


async def test_abort_ends_requests_in_flight_and_queues_new_ones(
    app, qwen2_engine, qwen2_renderer, qwen2_dir
):
    req = await render(qwen2_renderer, qwen2_dir, [1], **LONG)
    async with app_client(app) as c:
        running = [asyncio.create_task(post(c, req)) for _ in range(2)]
        await in_flight(qwen2_engine, 2)
        assert (await c.post("/pause", params={"mode": "abort"})).json() == {"status": "paused"}
        for answer in await asyncio.gather(*running):
            choice = answer["choices"][0]
            assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 600
        assert (await c.get("/is_paused")).json() == {"is_paused": True}
        queued = asyncio.create_task(post(c, req))  # held by the paused scheduler
        assert (await c.post("/resume")).json() == {"status": "resumed"}
        answer = await queued
        assert len(tokens(answer)) == 600 and answer["choices"][0]["finish_reason"] == "length"
        assert (await c.get("/is_paused")).json() == {"is_paused": False}


async def test_wait_lets_requests_in_flight_finish(app, qwen2_engine, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [1], **LONG)
    async with app_client(app) as c:
        running = asyncio.create_task(post(c, req))
        await in_flight(qwen2_engine, 1)
        r = await c.post("/pause", params={"mode": "wait"})
        assert r.status_code == 200
        # The pause answered once the request was done, and it was done whole.
        assert running.done()
        assert len(tokens(running.result())) == 600
        assert (await c.get("/is_paused")).json() == {"is_paused": True}
        assert (await c.post("/resume")).status_code == 200


async def test_keep_freezes_requests_and_a_weight_update_between_shows_in_their_versions(
    app, qwen2_engine, qwen2_renderer, qwen2_dir, tmp_path
):
    req = await render(qwen2_renderer, qwen2_dir, [1], **LONG)
    update = save(perturbed(qwen2_dir), tmp_path / "mid.safetensors")
    async with app_client(app) as c, restored(c, qwen2_dir, tmp_path):
        running = asyncio.create_task(post(c, req))
        await in_flight(qwen2_engine, 1)
        assert (await c.post("/pause", params={"mode": "keep"})).status_code == 200
        frozen_at = next(
            iter(qwen2_engine.llm.output_processor.request_states.values())
        ).detokenizer.num_output_tokens()
        assert 0 < frozen_at < 600
        await push(c, update.name, "mid")
        assert not running.done()  # still frozen, not lost
        assert (await c.post("/resume")).status_code == 200
        answer = await running
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) == 600 and choice["finish_reason"] == "length"
    spans = choice["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "mid"]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"]
    assert spans[1]["end"] == 600
    assert spans[0]["end"] >= frozen_at


async def test_an_unknown_mode_is_a_typed_400(app):
    async with app_client(app) as c:
        r = await c.post("/pause", params={"mode": "later"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
        assert (await c.get("/is_paused")).json() == {"is_paused": False}


STATE_CHANGING = [
    ("/pause", None),
    ("/resume", None),
    ("/abort_requests", {}),
    ("/init_weight_transfer_engine", {"init_info": {}}),
    ("/start_weight_update", {}),
    ("/update_weights", {"update_info": {"path": "x"}}),
    ("/finish_weight_update", {}),
    ("/abort_weight_update", None),
    ("/update_weight_version", {"new_version": "x"}),
    ("/reset_prefix_cache", None),
]


@pytest.mark.parametrize(("path", "body"), STATE_CHANGING)
async def test_state_changing_routes_need_an_admin_key_or_the_flag(
    qwen2_engine, qwen2_dir, path, body
):
    closed = generate_app(qwen2_engine, qwen2_dir)
    async with app_client(closed) as c:
        r = await c.post(path, json=body)
        assert r.status_code == 403 and r.json()["error"]["type"] == "control_routes_disabled"
        for route in ("/is_paused", "/weight_info", "/get_world_size", "/server_info"):
            assert (await c.get(route)).status_code == 200
        assert (await c.get("/is_paused")).json() == {"is_paused": False}
        assert (await c.get("/weight_info")).json()["weight_version"] == "default"
    keyed = generate_app(qwen2_engine, qwen2_dir, api_key="k")
    async with app_client(keyed) as c:
        r = await c.post(path, json=body)
        assert r.status_code == 401
        assert (await c.get("/is_paused")).status_code == 401
        # An inference key is no admin key: without --enable-control-routes, refused.
        r = await c.post(path, json=body, headers={"authorization": "Bearer k"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "admin_required"


async def test_without_admin_keys_the_flag_serves_the_routes_behind_the_key(
    qwen2_engine, qwen2_dir
):
    keyed = generate_app(qwen2_engine, qwen2_dir, api_key="k", enable_control_routes=True)
    async with app_client(keyed, headers={"authorization": "Bearer k"}) as c:
        assert (await c.post("/reset_prefix_cache")).status_code == 200
        assert (await c.post("/pause", params={"mode": "abort"})).status_code == 200
        assert (await c.post("/resume")).status_code == 200
        assert (await c.get("/is_paused")).json() == {"is_paused": False}


async def test_an_inference_key_changes_nothing_and_an_admin_key_may(
    qwen2_engine, qwen2_renderer, qwen2_dir, tmp_path
):
    # The flag is on too: once admin keys are set, it lets no inference key in.
    app = generate_app(
        qwen2_engine,
        qwen2_dir,
        api_key=("k", "k2"),
        admin_api_key=("a", "a2"),
        enable_control_routes=True,
        weight_transfer_dir=str(tmp_path),
    )
    req = await render(qwen2_renderer, qwen2_dir, [1], **LONG)
    inference = {"authorization": "Bearer k2"}
    admin = {"authorization": "Bearer a2"}
    async with app_client(app, headers=inference) as c:
        running = asyncio.create_task(post(c, req))
        await in_flight(qwen2_engine, 1)
        for path, body in STATE_CHANGING:
            r = await c.post(path, json=body)
            assert r.status_code == 403, (path, r.text)
            assert r.json()["error"]["type"] == "admin_required", path
        # The engine's own state: not paused, same version, the request ran to its end, and
        # no weight update was left started (an admin's start is not a conflict).
        assert (await c.get("/is_paused")).json() == {"is_paused": False}
        assert (await c.get("/weight_info")).json()["weight_version"] == "default"
        answer = await running
        assert answer["choices"][0]["finish_reason"] == "length"
        assert len(tokens(answer)) == 600
        assert (await c.post("/start_weight_update", headers=admin)).status_code == 200
        r = await c.post("/finish_weight_update", json={"weight_version": "default"}, headers=admin)
        assert r.status_code == 200
        assert (await c.post("/pause", headers=admin)).status_code == 200
        assert (await c.get("/is_paused")).json() == {"is_paused": True}
        assert (await c.post("/resume", headers=admin)).status_code == 200
        # An admin is a superset: it runs inference too.
        c.headers.update(admin)
        assert len(tokens(await post(c, req))) == 600


async def test_abort_requests_by_the_callers_id(app, qwen2_engine, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [1], **LONG)
    async with app_client(app) as c:
        running = asyncio.create_task(post(c, req))
        await in_flight(qwen2_engine, 1)
        r = await c.post("/abort_requests", json={"request_ids": ["someone-else"]})
        assert r.json() == {"status": "aborted", "aborted": 0}
        r = await c.post("/abort_requests", json={"request_ids": [req.request_id]})
        assert r.json() == {"status": "aborted", "aborted": 1}
        answer = await running
        assert answer["choices"][0]["finish_reason"] == "abort"
        assert len(tokens(answer)) < 600
