"""Video through the render app: frames processed, and Qwen3-VL's sparse is_embed mask sent."""

from __future__ import annotations

import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_wire import WireFormat, decode_generate_request

from ...support.asgi import app_client
from ...support.images import data_url, mp4_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


def video_chat(model: str) -> dict:
    url = data_url(mp4_bytes(), "video/mp4")
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "what?"}]
    return {"model": model, "messages": [{"role": "user", "content": content}]}


async def render_video(renderer, model):
    app = create_app(RenderSettings(model=model, pretouch_cache_memory=False), renderer=renderer)
    async with app_client(app) as c:
        r = await c.post("/v1/chat/completions/render", json=video_chat(model))
    assert r.status_code == 200, r.text
    return decode_generate_request(r.content, WireFormat.JSON)


async def test_qwen3_video_placeholders_carry_is_embed(qwen3_renderer):
    model = qwen3_renderer.model_config.model
    req = await render_video(qwen3_renderer, model)
    (ph,) = req.features.mm_placeholders["video"]
    # Timestamps and per-frame vision markers sit inside the run and take no embedding.
    assert ph.is_embed is not None and len(ph.is_embed) == ph.length
    assert 0 < sum(ph.is_embed) < ph.length
    assert req.features.kwargs_data["video"][0] is not None


async def test_qwen2_video_run_is_all_embeddings(qwen2_renderer, qwen2_dir):
    req = await render_video(qwen2_renderer, qwen2_dir)
    (ph,) = req.features.mm_placeholders["video"]
    assert ph.is_embed is None
    assert req.token_ids[ph.offset : ph.offset + ph.length] == [1023] * ph.length
