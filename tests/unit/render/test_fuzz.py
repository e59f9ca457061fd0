"""Fuzz the render routes with mutants of real chat and completion requests: no 5xx.

Seeded and bounded like tests/unit/generate/test_fuzz.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import ImageFile

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings

from ...support.asgi import app_client
from ...support.fuzz import keep_crash, mutations, solid_pngs
from ...support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

COUNT = int(os.environ.get("TANDEM_FUZZ_COUNT", "150"))


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_mutated_render_requests_never_get_a_5xx(qwen2_renderer, qwen2_dir, route):
    settings = RenderSettings(model=qwen2_dir, max_images_per_prompt=4, pretouch_cache_memory=False)
    app = create_app(settings, renderer=qwen2_renderer)
    img = data_url(png_bytes(64, 64, seed=62))
    if route == "chat":
        path = "/v1/chat/completions/render"
        seed_doc = chat_body(qwen2_dir, [img, img], max_tokens=4, temperature=0.0)
    else:
        path = "/v1/completions/render"
        seed_doc = {"model": qwen2_dir, "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3}
    seen: dict[int, int] = {}
    async with app_client(app, raise_app_exceptions=False) as c:
        for doc in mutations(seed_doc, seed=17, count=COUNT):
            r = await c.post(path, content=json.dumps(doc).encode(), timeout=120)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                kept = keep_crash(f"render-{route}", doc, r.text)
                pytest.fail(f"{r.status_code} for the input kept in {kept}: {r.text[:300]}")
        assert (await c.post(path, json=seed_doc)).status_code == 200
    print(f"render {route} fuzz: answers by status", dict(sorted(seen.items())))
    assert seen.get(400, 0) > 0


CRASHES = sorted((Path(__file__).resolve().parents[2] / "fuzz_crashes").glob("render-*.json"))


@pytest.mark.parametrize("kept", CRASHES, ids=lambda p: p.stem)
async def test_kept_crashing_inputs_stay_fixed(qwen2_renderer, qwen2_dir, kept):
    settings = RenderSettings(model=qwen2_dir, max_images_per_prompt=4, pretouch_cache_memory=False)
    app = create_app(settings, renderer=qwen2_renderer)
    doc = json.loads(kept.read_text())["input"]
    chat = "messages" in doc
    path = "/v1/chat/completions/render" if chat else "/v1/completions/render"
    async with app_client(app, raise_app_exceptions=False) as c:
        r = await c.post(path, content=json.dumps(doc).encode())
    assert r.status_code < 500, r.text


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_many_huge_single_colour_images_get_a_typed_4xx_undecoded(
    qwen2_renderer, qwen2_dir, route, monkeypatch
):
    # A generated hostile shape: as many 8000x8000 single-colour PNGs as a prompt may hold,
    # ~200 KB each on the wire, 192 MB each decoded. Answered from the headers alone.
    settings = RenderSettings(model=qwen2_dir, max_images_per_prompt=4, pretouch_cache_memory=False)
    app = create_app(settings, renderer=qwen2_renderer)
    images = [data_url(p) for p in solid_pngs(8000, 4)]
    if route == "chat":
        path, doc = "/v1/chat/completions/render", chat_body(qwen2_dir, images)
    else:
        pad = "<|vision_start|><|image_pad|><|vision_end|>"
        path = "/v1/completions/render"
        doc = {"model": qwen2_dir, "prompt": pad * 4, "images": [images]}
    decoded: list[tuple[int, int]] = []
    real_load = ImageFile.ImageFile.load

    def load(image: ImageFile.ImageFile):  # what decoding them would cost: ~12 s and ~2.6 GB
        decoded.append(image.size)
        return real_load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    async with app_client(app, raise_app_exceptions=False) as c:
        r = await c.post(path, content=json.dumps(doc).encode())
    assert r.status_code in (400, 413), r.text
    assert r.json()["error"]["type"] in ("media_too_large", "prompt_too_long")
    assert decoded == [], "answered from the headers alone"
