"""Seeded sampling on vLLM's CPU engine: a GRPO-shaped seeded batch, then business as usual."""

from __future__ import annotations

import pytest

from tandem_wire import GenerateRequest

from ...support.asgi import app_client
from ...support.images import png_bytes
from .helpers import client_stack, generate_app, post

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
# A user turn with two images, then the assistant turn (tiny Qwen2-VL token ids).
TWO_IMAGES = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 1019, IMAGE_PAD, 1020, 82, 1018, 198]
TWO_IMAGES += [1017, 436, 198]


async def test_a_seeded_grpo_batch_then_a_normal_request(qwen2_engine, qwen2_renderer, qwen2_dir):
    """32 prompts x 2 images of 448x448, n=4, seed=7: prefills that do not fit one step used
    to be split, and vLLM's rewind of a seeded CPU generator killed the engine core."""
    async with client_stack(qwen2_engine, qwen2_renderer, qwen2_dir) as client:
        images = [
            [png_bytes(448, 448, seed=2 * i), png_bytes(448, 448, seed=2 * i + 1)]
            for i in range(32)
        ]
        out = await client.rollout(
            [TWO_IMAGES] * 32,
            images,
            n=4,
            max_tokens=16,
            temperature=1.0,
            logprobs=0,
            seed=7,
            progress=False,
        )
        assert len(out.completion_ids) == 128
        assert all(1 <= len(c) <= 16 for c in out.completion_ids)
        assert not qwen2_engine.errored
        normal = await client.chat(
            [{"role": "user", "content": "Hello"}], max_tokens=4, ignore_eos=True
        )
        assert len(normal.choices[0].token_ids or []) == 4


async def test_seeds_are_refused_where_they_would_crash_the_engine(
    qwen2_engine, qwen2_dir, monkeypatch
):
    """With chunked prefill switched on by the operator on the CPU build, a seed is a typed 400
    (and the engine keeps serving), never an engine crash."""
    monkeypatch.setattr(qwen2_engine, "seeded_sampling_safe", False)
    seeded = GenerateRequest(token_ids=[1, 2, 3], sampling_params={"seed": 7, "max_tokens": 2})
    plain = GenerateRequest(token_ids=[1, 2, 3], sampling_params={"max_tokens": 2})
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        refused = await post(c, seeded, expect=400)
        await post(c, plain)
    assert refused["error"]["type"] == "invalid_sampling_params"
    assert refused["error"]["param"] == "sampling_params.seed"


def test_the_cpu_engine_runs_whole_prefills(qwen2_engine):
    scheduler = qwen2_engine.vllm_config.scheduler_config
    assert not scheduler.enable_chunked_prefill
    assert scheduler.max_num_batched_tokens >= qwen2_engine.max_model_len
    assert qwen2_engine.seeded_sampling_safe
