"""A request's media are judged from their headers, all together, before any is decoded: the
decoded budget (413) and the context (the typed 400 vLLM's own check answers with)."""

from __future__ import annotations

import pytest
from PIL import ImageFile

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings

from ...support.asgi import BodyCall, app_client
from ...support.audio import audio_bytes, input_audio_part
from ...support.images import chat_body, data_url, mp4_bytes, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

CHAT = "/v1/chat/completions/render"
COMPLETION = "/v1/completions/render"
SIDE = 64
ONE_IMAGE = SIDE * SIDE * 3  # decoded RGB bytes


@pytest.fixture
def decodes(monkeypatch):
    """Every image Pillow decodes, counted where Pillow decodes (headers need no load())."""
    calls: list[tuple[int, int]] = []
    real = ImageFile.ImageFile.load

    def load(self):
        calls.append(self.size)
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return calls


def make_app(renderer, model, **overrides):
    settings = RenderSettings(
        model=model, max_images_per_prompt=4, pretouch_cache_memory=False, **overrides
    )
    return create_app(settings, renderer=renderer)


def images(count: int, side: int = SIDE, first_seed: int = 900) -> list[str]:
    # Distinct images (pass a new ``first_seed`` for new ones), so no cache answers for them.
    seeds = range(first_seed, first_seed + count)
    return [data_url(png_bytes(side, side, seed=s, noise=False)) for s in seeds]


async def test_images_past_the_request_budget_are_refused_before_decoding(
    qwen2_renderer, qwen2_dir, decodes
):
    app = make_app(qwen2_renderer, qwen2_dir, max_decoded_request_bytes=3 * ONE_IMAGE)
    async with app_client(app) as c:
        r = await c.post(CHAT, json=chat_body(qwen2_dir, images(4)))
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["type"] == "media_too_large"
        assert str(3 * ONE_IMAGE) in error["message"]
        assert "--max-decoded-request-bytes" in error["message"]
        assert decodes == []
        # Right at the budget: rendered.
        r = await c.post(CHAT, json=chat_body(qwen2_dir, images(3)))
        assert r.status_code == 200, r.text
        assert decodes  # the spy sees decoding when it happens


async def test_completion_prompt_images_share_one_request_budget(
    qwen2_renderer, qwen2_dir, decodes
):
    app = make_app(qwen2_renderer, qwen2_dir, max_decoded_request_bytes=3 * ONE_IMAGE)
    pad = "<|vision_start|><|image_pad|><|vision_end|>"
    body = {
        "model": qwen2_dir,
        "prompt": [pad * 2 + "a", pad * 2 + "b"],
        "images": [images(2), images(2)],
        "max_tokens": 2,
    }
    async with app_client(app) as c:
        r = await c.post(COMPLETION, json=body)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["type"] == "media_too_large"
        assert decodes == []
        body["images"][1] = images(1)
        body["prompt"][1] = pad + "b"
        r = await c.post(COMPLETION, json=body)
        assert r.status_code == 200, r.text


async def test_video_frames_count_against_the_budget(qwen2_renderer, qwen2_dir):
    video = data_url(mp4_bytes(), "video/mp4")  # 8 frames of 112x112: 301056 bytes decoded
    app = make_app(qwen2_renderer, qwen2_dir, max_decoded_request_bytes=2 * 301056 - 1)
    content = [{"type": "video_url", "video_url": {"url": video}}] * 2
    body = {"model": qwen2_dir, "messages": [{"role": "user", "content": content}]}
    async with app_client(app) as c:
        r = await c.post(CHAT, json=body)
        assert r.status_code == 413, r.text
        assert "602112 bytes" in r.json()["error"]["message"]


async def test_audio_samples_count_against_the_budget(qwen2_audio_renderer, qwen2_audio_dir):
    clip = audio_bytes(seconds=1.0)  # 16000 mono samples: 64000 bytes as float32
    app = make_app(qwen2_audio_renderer, qwen2_audio_dir, max_decoded_request_bytes=127999)
    content = [input_audio_part(clip), input_audio_part(clip)]
    body = {"model": qwen2_audio_dir, "messages": [{"role": "user", "content": content}]}
    async with app_client(app) as c:
        r = await c.post(CHAT, json=body)
        assert r.status_code == 413, r.text
        assert "128000 bytes" in r.json()["error"]["message"]


async def test_images_that_cannot_fit_the_context_are_refused_before_decoding(
    qwen2_renderer, qwen2_dir, decodes
):
    # The tiny Qwen2-VL: a 4096-token context, max_pixels 1003520. Four 1024x1024 images are
    # resized to 980x980 each, 1225 tokens: 4900 in all. vLLM would say so after decoding.
    app = make_app(qwen2_renderer, qwen2_dir)
    big = images(4, side=1024)
    async with app_client(app) as c:
        r = await c.post(CHAT, json=chat_body(qwen2_dir, big))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "prompt_too_long"
        assert "4900 tokens" in error["message"] and "4096" in error["message"]
        assert decodes == []
        # The request's own max_pixels shrinks them (64 tokens each): they fit, and render.
        small = chat_body(qwen2_dir, big, mm_processor_kwargs={"max_pixels": 224 * 224})
        r = await c.post(CHAT, json=small)
        assert r.status_code == 200, r.text


async def test_completion_prompts_are_fitted_to_the_context_one_by_one(
    qwen2_renderer, qwen2_dir, decodes
):
    app = make_app(qwen2_renderer, qwen2_dir)
    pad = "<|vision_start|><|image_pad|><|vision_end|>"
    big = images(4, side=1024)
    body = {
        "model": qwen2_dir,
        "prompt": [pad * 2 + "a", pad * 2 + "b"],
        "images": [big[:2], big[2:]],
        "max_tokens": 2,
    }
    async with app_client(app) as c:
        # Two prompts of 2450 tokens each: each fits, though together they would not.
        r = await c.post(COMPLETION, json=body)
        assert r.status_code == 200, r.text
        decodes.clear()
        body["images"] = [None, images(4, side=1024, first_seed=950)]
        body["prompt"] = ["a", pad * 4 + "b"]
        r = await c.post(COMPLETION, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "prompt_too_long"
        assert decodes == []


def test_image_tokens_follow_vllms_own_rule(qwen2_renderer):
    assert qwen2_renderer.image_tokens(1024, 1024, {}) == 1225
    assert qwen2_renderer.image_tokens(448, 448, {}) == 256
    assert qwen2_renderer.image_tokens(1024, 1024, {"max_pixels": 224 * 224}) == 64
    assert qwen2_renderer.image_tokens(8000, 8000, {}) == 1225  # shrunk to max_pixels


async def test_decoded_media_are_charged_to_the_process_budget_before_decoding(
    qwen2_renderer, qwen2_dir, decodes
):
    # Four 64x64 images: a few KB on the wire, 4 x 12 KiB decoded. Before, only their body
    # was charged: 64 such requests fetched and decoded at once whatever the budget said.
    body = chat_body(qwen2_dir, images(4, first_seed=700))
    app = make_app(qwen2_renderer, qwen2_dir, max_held_bytes=4 * ONE_IMAGE - 1)
    async with app_client(app) as c:
        r = await c.post(CHAT, json=body)
        assert r.status_code == 413, r.text  # could never fit this process's budget
        assert decodes == []
    app = make_app(qwen2_renderer, qwen2_dir, max_held_bytes=8 * ONE_IMAGE)
    async with app_client(app) as c:
        holder = BodyCall(
            app, CHAT, [b"{"], declared=5 * ONE_IMAGE, ends=False
        )  # holds 5 images' worth
        r = await c.post(CHAT, json=body)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["details"]["wanted_bytes"] == 4 * ONE_IMAGE
        assert decodes == []
        holder.task.cancel()
        r = await c.post(CHAT, json=body)
        assert r.status_code == 200, r.text
