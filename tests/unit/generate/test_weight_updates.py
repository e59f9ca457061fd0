"""Weight updates through the control routes on the real engine (the ``tandem_file`` backend).

The trainer side is played here: it perturbs the tiny model's checkpoint with torch, writes
the file into the weight-transfer folder and drives start/update/finish over HTTP. Every test
that changes the shared engine's weights pushes the original checkpoint back (``restored``).
"""

from __future__ import annotations

import asyncio
import shutil
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ...support.asgi import app_client
from .helpers import GREEDY, client_stack, generate_app, post, render, tokens, with_sampling

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

PERTURBED = "lm_head.weight"
# Whole layers besides the head: fused on load (q/k/v -> qkv_proj, gate/up -> gate_up_proj)
# and pre-packed by the CPU kernels, so a reload that skipped either would show in the tokens.
PERTURBED_LAYERS = ("model.layers.1.", "visual.blocks.0.")


def checkpoint(model_dir: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def perturbed(model_dir: str) -> dict:
    """A toy training step: the output projection and two whole layers moved, far enough to
    change greedy tokens. Only the changed tensors are returned (an update may be partial)."""
    import torch

    weights = checkpoint(model_dir)
    gen = torch.Generator().manual_seed(7)
    out = {}
    for name, w in weights.items():
        if name == PERTURBED or name.startswith(PERTURBED_LAYERS):
            noise = torch.randn(w.shape, generator=gen, dtype=torch.float32)
            out[name] = (w.float() + noise * (w.float().std() + 0.01) * 4).to(w.dtype)
    return out


def save(tensors: dict, path: Path) -> Path:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def weight_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "weights"
    folder.mkdir()
    return folder


@pytest.fixture
def app(qwen2_engine, qwen2_dir, weight_dir):
    return generate_app(
        qwen2_engine, qwen2_dir, enable_control_routes=True, weight_transfer_dir=str(weight_dir)
    )


async def push(c, path: str, version: str | None) -> None:
    assert (await c.post("/start_weight_update", json={})).status_code == 200
    r = await c.post("/update_weights", json={"update_info": {"path": path}})
    assert r.status_code == 200, r.text
    r = await c.post("/finish_weight_update", json={"weight_version": version})
    assert r.status_code == 200, r.text


@asynccontextmanager
async def restored(c, qwen2_dir: str, weight_dir: Path):
    """Whatever happens inside, the shared engine ends with its original weights and label."""
    try:
        yield
    finally:
        await c.post("/resume")
        await c.post("/finish_weight_update", json={})  # ends a half-done update, if any
        original = save(checkpoint(qwen2_dir), weight_dir / "original.safetensors")
        await push(c, original.name, "default")


async def test_update_gives_the_tokens_of_an_engine_loaded_from_the_new_checkpoint(
    app, qwen2_engine, qwen2_renderer, qwen2_dir, weight_dir, tmp_path
):
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tandem_generate.engine import Engine

    req = await render(qwen2_renderer, qwen2_dir, [1], **GREEDY)
    new = perturbed(qwen2_dir)
    # The reference: a fresh engine loaded from the perturbed checkpoint (then shut down).
    fresh_dir = tmp_path / "perturbed-model"
    shutil.copytree(qwen2_dir, fresh_dir)
    save({**checkpoint(qwen2_dir), **new}, fresh_dir / "model.safetensors")
    fresh = Engine(
        AsyncEngineArgs(
            model=str(fresh_dir),
            served_model_name=qwen2_dir,
            enforce_eager=True,
            max_model_len=4096,
            max_num_seqs=8,
            seed=0,
        )
    )
    try:
        async with app_client(generate_app(fresh, qwen2_dir)) as c:
            expected = tokens(await post(c, req))
    finally:
        fresh.shutdown()

    update = save(new, weight_dir / "step-1.safetensors")
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        before = await post(c, req)
        assert before["choices"][0]["weight_versions"] == [
            {"version": "default", "start": 0, "end": 8}
        ]
        first = (await c.get("/weight_info")).json()
        await push(c, str(update), "step-1")  # an absolute path inside the folder
        after = await post(c, req)
        info = (await c.get("/weight_info")).json()
        assert info["weight_version"] == "step-1" and not info["updating"]
        # What routers judge by: the update it applied, and a new digest of what it holds.
        assert info["applied_seqs"][0] == info["update_seq"] == first["seen_seq"] + 1
        assert info["weights_id"] != first["weights_id"] and info["unclean"] is None
    assert tokens(after) == expected
    assert tokens(after) != tokens(before)
    assert after["choices"][0]["weight_versions"] == [{"version": "step-1", "start": 0, "end": 8}]
    # And the original weights are back: the first answer again.
    async with app_client(app) as c:
        assert tokens(await post(c, req)) == tokens(before)


@pytest.mark.parametrize(
    ("case", "status", "type_"),
    [
        ("wrong_shape", 400, "invalid_weight_update"),
        ("unknown_name", 400, "invalid_weight_update"),
        ("wrong_dtype", 400, "invalid_weight_update"),
        ("part_of_a_layer", 400, "invalid_weight_update"),
        ("not_safetensors", 400, "invalid_weight_update"),
        ("outside_folder", 400, "weight_path_not_allowed"),
        ("dotdot", 400, "weight_path_not_allowed"),
        ("symlink_out", 400, "weight_path_not_allowed"),
    ],
)
async def test_a_bad_update_is_refused_and_the_old_weights_keep_serving(
    app, qwen2_renderer, qwen2_dir, weight_dir, tmp_path, case, status, type_
):
    import torch

    good = perturbed(qwen2_dir)
    head = good[PERTURBED]
    layer = "model.layers.0.self_attn.q_proj.weight"
    files = {
        "wrong_shape": {PERTURBED: head[:-1].clone()},
        "unknown_name": {PERTURBED: head, "lm_head.extra": torch.zeros(2)},
        "wrong_dtype": {PERTURBED: head.to(torch.float16)},
        "part_of_a_layer": {layer: checkpoint(qwen2_dir)[layer]},
    }
    name = f"{case}.safetensors"
    if case in files:
        save(files[case], weight_dir / name)
    elif case == "not_safetensors":
        (weight_dir / name).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    elif case == "outside_folder":
        name = str(save({PERTURBED: head}, tmp_path / name))
    elif case == "dotdot":
        save({PERTURBED: head}, tmp_path / name)
        name = f"../{name}"
    else:  # a link inside the folder to a file outside it
        (weight_dir / name).symlink_to(save({PERTURBED: head}, tmp_path / name))
    req = await render(qwen2_renderer, qwen2_dir, [2], **GREEDY)
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        before = tokens(await post(c, req))
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        r = await c.post("/update_weights", json={"update_info": {"path": name}})
        assert r.status_code == status, r.text
        assert r.json()["error"]["type"] == type_
        r = await c.post("/finish_weight_update", json={"weight_version": "bad"})
        assert r.status_code == 200
        assert tokens(await post(c, req)) == before


async def test_calls_out_of_order_are_refused_as_vllm_refuses_them(app, qwen2_dir, weight_dir):
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        r = await c.post("/update_weights", json={"update_info": {"path": "x.safetensors"}})
        assert (r.status_code, r.json()["error"]["type"]) == (409, "weight_update_conflict")
        r = await c.post("/finish_weight_update", json={})
        assert r.status_code == 409
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        r = await c.post("/start_weight_update", json={})
        assert (r.status_code, r.json()["error"]["type"]) == (409, "weight_update_conflict")
        assert (await c.post("/finish_weight_update", json={})).status_code == 200


async def test_an_aborted_update_loads_nothing_and_ends_the_update(
    app, qwen2_renderer, qwen2_dir, weight_dir
):
    update = save(perturbed(qwen2_dir), weight_dir / "step-1.safetensors")
    req = await render(qwen2_renderer, qwen2_dir, [3], **GREEDY)
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        before = tokens(await post(c, req))
        held = (await c.get("/weight_info")).json()["weights_id"]
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        r = await c.post("/update_weights", json={"update_info": {"path": update.name}})
        assert r.status_code == 200, r.text
        assert (await c.get("/weight_info")).json()["updating"] is True
        r = await c.post("/abort_weight_update")
        assert r.status_code == 200 and r.json()["aborted"] is True
        # Nothing staged survives: a finish now has no update to end, and nothing changed.
        r = await c.post("/finish_weight_update", json={"weight_version": "step-1"})
        assert (r.status_code, r.json()["error"]["type"]) == (409, "weight_update_conflict")
        info = (await c.get("/weight_info")).json()
        assert (info["weight_version"], info["updating"], info["weights_id"]) == (
            "default",
            False,
            held,
        )
        assert tokens(await post(c, req)) == before
        assert (await c.post("/abort_weight_update")).json()["aborted"] is False
        # The engine takes the next update as usual.
        await push(c, update.name, "step-1")
        assert tokens(await post(c, req)) != before


async def test_a_finish_after_other_chunks_than_the_caller_sent_loads_nothing(
    app, qwen2_renderer, qwen2_dir, weight_dir
):
    # A router sent two chunks; the first (and its abort) never reached this node.
    from tandem_wire.control import UPDATE_RECEIVED_HEADER, UpdateId, UpdateReceipt

    new = perturbed(qwen2_dir)
    layers = {n: t for n, t in new.items() if n != PERTURBED}
    first = save(layers, weight_dir / "layers.safetensors")
    second = save({PERTURBED: new[PERTURBED]}, weight_dir / "head.safetensors")
    req = await render(qwen2_renderer, qwen2_dir, [4], **GREEDY)
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        before = tokens(await post(c, req))
        r = await c.post("/start_weight_update", json={})
        uid = UpdateId.parse(r.json()["update_id"])
        sent = UpdateReceipt.begin(uid)
        for f in (first, second):
            sent = sent.took({"path": f.name})
        r = await c.post("/update_weights", json={"update_info": {"path": second.name}})
        assert r.status_code == 200, r.text
        taken = (await c.get("/weight_info")).json()["receiving"]
        assert (taken["update_id"], taken["chunks"]) == (str(uid), 1)
        r = await c.post("/finish_weight_update", json={}, headers={UPDATE_RECEIVED_HEADER: "2:x"})
        assert (r.status_code, r.json()["error"]["type"]) == (400, "invalid_request")
        headers = {UPDATE_RECEIVED_HEADER: sent.header()}
        r = await c.post("/finish_weight_update", json={}, headers=headers)
        assert (r.status_code, r.json()["error"]["type"]) == (409, "weight_update_incomplete")
        info = (await c.get("/weight_info")).json()
        assert (info["updating"], info["update_seq"], info["receiving"]) == (False, 0, None)
        assert tokens(await post(c, req)) == before  # the head alone was not loaded either
        # Both chunks, and the receipt they make: loaded.
        r = await c.post("/start_weight_update", json={})
        sent = UpdateReceipt.begin(UpdateId.parse(r.json()["update_id"]))
        for f in (first, second):
            await c.post("/update_weights", json={"update_info": {"path": f.name}})
            sent = sent.took({"path": f.name})
        headers = {UPDATE_RECEIVED_HEADER: sent.header()}
        r = await c.post("/finish_weight_update", json={}, headers=headers)
        assert r.status_code == 200, r.text
        assert tokens(await post(c, req)) != before


async def test_version_label_without_new_weights(app, qwen2_dir, weight_dir):
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        r = await c.post("/update_weight_version", json={"new_version": "relabelled"})
        assert r.json() == {"success": True, "new_version": "relabelled"}
        assert (await c.get("/weight_info")).json()["weight_version"] == "relabelled"


async def test_server_info_and_world_size_answer_as_trl_reads_them(app, qwen2_engine):
    # A token the engine was started with (--hf-token) is never served: any inference key
    # may read this route, and vLLM serves its config only in dev mode.
    model_config = qwen2_engine.vllm_config.model_config
    saved, model_config.hf_token = model_config.hf_token, "hf_not_for_callers"
    try:
        async with app_client(app) as c:
            r = await c.get("/server_info", params={"config_format": "json"})
    finally:
        model_config.hf_token = saved
    assert "hf_not_for_callers" not in r.text
    info = r.json()
    assert info["vllm_config"]["model_config"]["hf_token"] == "<redacted>"
    assert info["vllm_config"]["weight_transfer_config"] == {"backend": "tandem_file"}
    async with app_client(app) as c:
        assert (await c.get("/get_world_size")).json() == {"world_size": 1}
        assert (await c.get("/is_paused")).json() == {"is_paused": False}


async def test_the_client_updates_the_nodes_and_rollouts_name_the_version(
    qwen2_engine, qwen2_renderer, qwen2_dir, weight_dir
):
    import tandem_client as tc

    stack = client_stack(
        qwen2_engine, qwen2_renderer, qwen2_dir, str(weight_dir), enable_control_routes=True
    )
    sampling = {"temperature": 0.0, "max_tokens": 6, "logprobs": None}
    async with stack as client:
        try:
            before = await client.rollout(["a red square", "two cats"], **sampling)
            assert before.versions() == ["default", "default"]
            await client.update_weights(perturbed(qwen2_dir), version="step-1")  # torch bf16
            assert list(weight_dir.iterdir()) == []  # the client removed its file
            assert await client.weight_versions() == {"http://generate": "step-1"}
            after = await client.rollout(["a red square", "two cats"], **sampling)
            assert after.versions() == ["step-1", "step-1"]
            assert after.as_dict()["weight_versions"][0] == [
                {"version": "step-1", "start": 0, "end": 6}
            ]
            assert after.completion_ids != before.completion_ids
            with pytest.raises(tc.WeightUpdateError) as refused:
                await client.update_weights({"no.such.tensor": np.zeros(2)}, version="bad")
            assert refused.value.type == "invalid_weight_update"
            assert await client.weight_versions() == {"http://generate": "step-1"}
            again = await client.rollout(["a red square", "two cats"], **sampling)
            assert again.completion_ids == after.completion_ids
        finally:
            await client.update_weights(checkpoint(qwen2_dir), version="default")
        restored_ = await client.rollout(["a red square", "two cats"], **sampling)
        assert restored_.completion_ids == before.completion_ids


async def cached_tokens(engine, prompt: list[int]) -> int:
    """Prompt tokens the engine served from its prefix cache for one request (its own count)."""
    import secrets

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1)
    final = None
    async for out in engine.llm.generate(
        TokensPrompt(prompt_token_ids=prompt), params, f"probe-{secrets.token_hex(4)}"
    ):
        final = out
    assert final is not None and final.num_cached_tokens is not None
    return int(final.num_cached_tokens)


async def test_an_update_while_requests_run_leaves_no_old_kv_to_reuse(
    app, qwen2_engine, qwen2_dir, weight_dir
):
    """vLLM refuses a plain prefix-cache reset while a request holds KV blocks; the update
    must still end with no KV of the old weights reusable (the engine's own count of cached
    prompt tokens), and the running request completes."""

    from tandem_wire import GenerateRequest

    prompt = [300 + (i * 37) % 600 for i in range(640)]  # several whole KV blocks
    long = GenerateRequest(
        token_ids=[301, 302, 303],
        sampling_params={"temperature": 0.0, "max_tokens": 2000, "ignore_eos": True},
    )
    same = save(checkpoint(qwen2_dir), weight_dir / "same.safetensors")
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        await cached_tokens(qwen2_engine, prompt)
        assert await cached_tokens(qwen2_engine, prompt) > 0  # the baseline: a repeat hits

        running = asyncio.create_task(post(c, long))
        while not qwen2_engine.llm.output_processor.request_states:
            await asyncio.sleep(0.05)
        await push(c, same.name, "same-weights")
        assert not running.done()  # the update happened while the request ran
        assert await cached_tokens(qwen2_engine, prompt) == 0
        answer = await running
    assert len(tokens(answer)) == 2000
    assert answer["choices"][0]["weight_versions"][-1]["version"] == "same-weights"


async def scheduled(engine, running) -> Any:
    """The engine's state of the one request in flight, once its prefill has run."""
    while not running.done():
        states = list(engine.llm.output_processor.request_states.values())
        if states and not states[0].is_prefilling:
            return states[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"the request ended before it was seen running: {running.result()}")


async def test_a_request_preempted_after_a_prefix_hit_over_its_images_encodes_them_again(
    app, qwen2_engine, qwen2_renderer, qwen2_dir, weight_dir
):
    """vLLM hands its workers a request whose prefix-cache hit covers an image without that
    image's tensors. The update preempts it and resets both caches: it resumes with no prefix
    and no encoder output to reuse, so the image is encoded again, for it (with vLLM 0.32's
    own scheduler the worker holds no pixels then, and the engine core dies)."""
    warm = await render(qwen2_renderer, qwen2_dir, [61, 62, 63], temperature=0.0, max_tokens=1)
    long = with_sampling(warm, max_tokens=2000, ignore_eos=True)
    first = warm.features.mm_placeholders["image"][0]
    same = save(checkpoint(qwen2_dir), weight_dir / "same.safetensors")
    async with app_client(app) as c, restored(c, qwen2_dir, weight_dir):
        await post(c, warm)  # its KV blocks, over the first image too, stay in the cache
        running = asyncio.create_task(post(c, long))
        state = await scheduled(qwen2_engine, running)
        assert state.num_cached_tokens >= first.offset + first.length  # the hit covers it
        await push(c, same.name, "same-weights")
        assert not running.done()  # preempted by the update, not finished before it
        answer = await running
    assert len(tokens(answer)) == 2000
    assert answer["choices"][0]["weight_versions"][-1]["version"] == "same-weights"


def test_secrets_and_connector_settings_are_redacted_wherever_they_sit():
    from tandem_generate.control import REDACTED, scrubbed

    dump = {
        "model_config": {"hf_token": "t", "tokenizer": "x", "max_model_len": 5, "hf_overrides": {}},
        "kv_transfer_config": {
            "kv_connector": "NixlConnector",
            "kv_connector_extra_config": {"bucket_credentials": "c", "endpoint": "e"},
        },
        "additional_config": {"store_api_key": "k", "nodes": [{"password": "p", "port": 1}]},
        "speculative_config": None,
        "cache_config": {"secret_unset": None},
    }
    assert scrubbed(dump) == {
        "model_config": {
            "hf_token": REDACTED,
            "tokenizer": "x",
            "max_model_len": 5,
            "hf_overrides": {},
        },
        "kv_transfer_config": {
            "kv_connector": "NixlConnector",
            "kv_connector_extra_config": REDACTED,
        },
        "additional_config": {
            "store_api_key": REDACTED,
            "nodes": [{"password": REDACTED, "port": 1}],
        },
        "speculative_config": None,
        "cache_config": {"secret_unset": None},
    }


def test_loader_and_connector_configs_are_opaque_whatever_their_shape():
    """A loader's extra config may hold an object store's credentials under any name, or be a
    config object (dumped as its repr); a dict-valued field of a loader or connector section
    is opaque too. Plain settings stay readable."""
    from tandem_generate.control import REDACTED, scrubbed

    dump = {
        "load_config": {
            "load_format": "tensorizer",
            "model_loader_extra_config": {"s3_endpoint": "e", "bucket_keys": {"id": "k"}},
            "pt_load_map_location": {"cuda:1": "cuda:0"},
            "ignore_patterns": ["*.pt"],
        },
        "kv_transfer_config": {"kv_connector": "LMCache", "kv_port": 1, "settings": {"x": "y"}},
        "ec_transfer_config": {"ec_connector_extra_config": "Config(uri='s3://k:s@b')"},
        "model_config": {"hf_overrides": {"architectures": ["X"]}},
    }
    assert scrubbed(dump) == {
        "load_config": {
            "load_format": "tensorizer",
            "model_loader_extra_config": REDACTED,
            "pt_load_map_location": REDACTED,
            "ignore_patterns": ["*.pt"],
        },
        "kv_transfer_config": {"kv_connector": "LMCache", "kv_port": 1, "settings": REDACTED},
        "ec_transfer_config": {"ec_connector_extra_config": REDACTED},
        "model_config": {"hf_overrides": {"architectures": ["X"]}},
    }
    # A loader config object, dumped as its repr (vLLM's ``fallback=str``), is opaque whole.
    tensorizer = {"load_config": {"model_loader_extra_config": "TensorizerConfig(s3_key='k')"}}
    assert scrubbed(tensorizer) == {"load_config": {"model_loader_extra_config": REDACTED}}
