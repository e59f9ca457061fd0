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


@pytest.mark.parametrize(
    ("limit", "value"),
    [
        ({"max_video_frames": 7}, "8 frames"),
        ({"max_video_seconds": 1.5}, "2 seconds"),
        ({"max_image_pixels": 112 * 112 - 1}, "12544 pixels per frame"),
        ({"max_decoded_video_bytes": 8 * 112 * 112 * 3 - 1}, "301056 bytes of decoded frames"),
    ],
)
async def test_a_video_over_a_limit_is_refused_from_its_header(
    qwen2_renderer, qwen2_dir, limit, value
):
    # mp4_bytes(): 8 frames of 112x112 at 4 fps (2 s); vLLM decodes at most 32 frames of it.
    settings = RenderSettings(model=qwen2_dir, pretouch_cache_memory=False, **limit)
    renderer = qwen2_renderer
    saved = renderer.video_limits
    renderer.video_limits = type(saved)(
        max_seconds=settings.max_video_seconds,
        max_frames=settings.max_video_frames,
        max_frame_pixels=settings.max_image_pixels,
        max_decoded_bytes=settings.max_decoded_video_bytes,
    )
    decoded = []
    real = renderer.render_chat

    async def spy(*args, **kwargs):
        decoded.append(1)
        return await real(*args, **kwargs)

    renderer.render_chat = spy
    try:
        app = create_app(settings, renderer=renderer)
        async with app_client(app) as c:
            r = await c.post("/v1/chat/completions/render", json=video_chat(qwen2_dir))
            assert r.status_code == 413, r.text
            err = r.json()["error"]
            assert err["type"] == "media_too_large" and value in err["message"], err
            assert decoded == []  # refused before vLLM decoded a frame
            bad = {**video_chat(qwen2_dir)}
            bad["messages"][0]["content"][0]["video_url"]["url"] = data_url(
                b"\x00" * 64, "video/mp4"
            )
            r = await c.post("/v1/chat/completions/render", json=bad)
            assert (r.status_code, r.json()["error"]["type"]) == (400, "invalid_media"), r.text
    finally:
        renderer.video_limits = saved
        del renderer.render_chat
