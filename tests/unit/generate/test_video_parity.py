"""Video on the generate side: render -> generate gives vLLM's own chat tokens and logprobs for
the same clip, JSON and binary, on Qwen2-VL and on Qwen3-VL (whose video runs interleave
timestamp tokens that take no embedding, so ``is_embed`` decides where frames go)."""

from __future__ import annotations

import msgspec
import pytest

from tandem_wire import PlaceholderRange

from ...support.asgi import app_client
from ...support.images import data_url, mp4_bytes
from ...support.vllm_chat import generate_steps
from .helpers import cpu_engine, generate_app, post
from .parity import GREEDY_WITH_LOGPROBS, assert_same_steps, ours, reference

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]


def video_chat(model: str, seed: int = 0) -> dict:
    url = data_url(mp4_bytes(seed=seed), "video/mp4")
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "what?"}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


@pytest.fixture(scope="module")
async def qwen3_engine(qwen3_renderer, anyio_backend):
    """The session's one Qwen3-VL engine (only this module starts it; stopped after it)."""
    engine = cpu_engine(qwen3_renderer.model_config.model)
    yield engine
    engine.shutdown()


async def test_qwen2_vl_video_equals_vllm_chat(qwen2_engine, qwen2_renderer, qwen2_dir):
    body = video_chat(qwen2_dir)
    expected = await reference(qwen2_engine, qwen2_dir, body)
    answers, rendered = await ours(qwen2_engine, qwen2_renderer, qwen2_dir, body)
    (ph,) = rendered.features.mm_placeholders["video"]
    assert ph.is_embed is None  # Qwen2-VL's run is all frame patches
    assert len(expected) == GREEDY_WITH_LOGPROBS["max_tokens"]
    assert_same_steps(answers["json"], expected)
    assert_same_steps(answers["binary"], expected)


async def test_qwen3_vl_video_equals_vllm_chat(qwen3_engine, qwen3_renderer):
    model = qwen3_renderer.model_config.model
    body = video_chat(model)
    expected = await reference(qwen3_engine, model, body)
    answers, rendered = await ours(qwen3_engine, qwen3_renderer, model, body)
    (ph,) = rendered.features.mm_placeholders["video"]
    # Timestamps and per-frame markers sit inside the run: the engine must skip them.
    assert ph.is_embed is not None and 0 < sum(ph.is_embed) < ph.length
    assert len(expected) == GREEDY_WITH_LOGPROBS["max_tokens"]
    assert_same_steps(answers["json"], expected)
    assert_same_steps(answers["binary"], expected)
    # Another clip answers otherwise: the comparison above is of the video, not of the text.
    other = await reference(qwen3_engine, model, video_chat(model, seed=1))
    assert [s[1] for s in other] != [s[1] for s in expected]


async def test_qwen3_vl_video_from_an_upstream_shaped_render(qwen3_engine, qwen3_renderer):
    # Upstream's render drops is_embed; generate recomputes it from the tokens, so the same
    # request without it gets the same answer.
    model = qwen3_renderer.model_config.model
    body = video_chat(model, seed=2)
    expected = await reference(qwen3_engine, model, body)
    _, rendered = await ours(qwen3_engine, qwen3_renderer, model, body)
    feats = rendered.features
    bare = {
        m: [PlaceholderRange(offset=p.offset, length=p.length) for p in ps]
        for m, ps in feats.mm_placeholders.items()
    }
    upstream_shaped = msgspec.structs.replace(
        rendered, features=msgspec.structs.replace(feats, mm_placeholders=bare)
    )
    async with app_client(generate_app(qwen3_engine, model)) as c:
        assert_same_steps(generate_steps(await post(c, upstream_shaped)), expected)
