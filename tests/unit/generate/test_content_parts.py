"""``content_parts`` on generate: raw image and video URLs resolved by a render node
(in-process here), then generated from exactly as if the caller had sent render's features."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest

from tandem_client import AsyncTandemClient
from tandem_render.app import create_app as create_render_app
from tandem_render.settings import RenderSettings
from tandem_wire import GenerateRequest

from ...support.asgi import HostRouter
from ...support.images import data_url, mp4_bytes, png_bytes
from .helpers import generate_app

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
VIDEO_PAD = 1023
GENERATE = "/inference/v1/generate"
# A Qwen2-VL chat prompt as token ids, one <|vision_start|><|image_pad|><|vision_end|> per image.
ONE_IMAGE = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 82, 1018, 198, 1017, 436, 198]
TWO_IMAGES = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 1019, IMAGE_PAD, 1020, 82, 1018, 198]
# One <|vision_start|><|video_pad|><|vision_end|>; then an image before a video.
ONE_VIDEO = [1017, 359, 261, 198, 1019, VIDEO_PAD, 1020, 82, 1018, 198, 1017, 436, 198]
IMAGE_THEN_VIDEO = [
    1017,
    359,
    261,
    198,
    1019,
    IMAGE_PAD,
    1020,
    1019,
    VIDEO_PAD,
    1020,
    82,
    1018,
    198,
]
SAMPLING = {"temperature": 0.0, "max_tokens": 6, "logprobs": 2}


def image(seed: int) -> dict:
    return {"type": "image_url", "url": data_url(png_bytes(seed=seed))}


def video(seed: int) -> dict:
    return {"type": "video_url", "url": data_url(mp4_bytes(seed=seed), "video/mp4")}


@dataclass
class Nodes:
    render: object
    generate: httpx.AsyncClient
    to_render: httpx.AsyncClient
    apps: dict


@pytest.fixture
async def nodes(qwen2_engine, qwen2_renderer, qwen2_dir) -> AsyncIterator[Nodes]:
    """A render app and a generate app that resolves content_parts through it (in-process)."""
    render = create_render_app(
        RenderSettings(
            model=qwen2_dir,
            max_images_per_prompt=8,
            max_videos_per_prompt=1,
            pretouch_cache_memory=False,
        ),
        qwen2_renderer,
    )
    generate = generate_app(
        qwen2_engine,
        qwen2_dir,
        render_transport=httpx.ASGITransport(app=render),
        content_parts_render_url="http://render",
    )
    async with AsyncExitStack() as stack:
        for app in (render, generate):
            await stack.enter_async_context(app.router.lifespan_context(app))
        gen = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=generate), base_url="http://g")
        )
        ren = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=render), base_url="http://r")
        )
        yield Nodes(render, gen, ren, {"render": render, "generate": generate})


async def rendered(nodes: Nodes, prompt: list[int], parts: list[dict]) -> dict:
    """Render's own answer (JSON) for this token prompt and these media (flat-url parts)."""
    body: dict = {"prompt": prompt, "max_tokens": 1}
    for kind, field in (("image_url", "images"), ("video_url", "videos")):
        urls = [p["url"] for p in parts if p["type"] == kind]
        if urls:
            body[field] = [urls]
    r = await nodes.to_render.post("/v1/completions/render", json=body)
    assert r.status_code == 200, r.text[:500]
    (req,) = r.json()
    return req  # type: ignore[no-any-return]


def logprobs(answer: dict) -> list[float]:
    return [e["logprob"] for e in answer["choices"][0]["logprobs"]["content"]]


async def as_render_features(
    nodes: Nodes, prompt: list[int], parts: list[dict], modality: str
) -> tuple[dict, dict]:
    """Generate's answer to ``prompt`` with ``parts`` as content_parts, asserted equal to its
    answer to render's own features for them (tokens, logprobs, the expanded prompt and the
    ``modality`` placeholders): that answer, and the content_parts body."""
    direct = await rendered(nodes, prompt, parts)
    assert direct["token_ids"] != prompt  # render expanded the placeholders
    r = await nodes.generate.post(GENERATE, json={**direct, "sampling_params": SAMPLING})
    assert r.status_code == 200, r.text[:500]
    want = r.json()
    body = {
        "token_ids": prompt,
        "content_parts": parts,
        "sampling_params": SAMPLING,
        "return_token_ids": True,
    }
    r = await nodes.generate.post(GENERATE, json=body)
    assert r.status_code == 200, r.text[:500]
    got = r.json()
    assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
    assert logprobs(got) == pytest.approx(logprobs(want), abs=1e-4)
    # The engine saw render's expanded prompt and its placeholders.
    assert got["prompt_token_ids"] == direct["token_ids"]
    placeholders = direct["features"]["mm_placeholders"][modality]
    assert [(p["offset"], p["length"]) for p in got["mm_placeholders"][modality]] == [
        (p["offset"], p["length"]) for p in placeholders
    ]
    return want, body


async def test_content_parts_generate_as_render_features_do(nodes):
    parts = [image(11), image(12)]
    want, body = await as_render_features(nodes, TWO_IMAGES, parts, "image")

    # The pixels matter: the same prompt with the images swapped is another prompt.
    swapped = {**body, "content_parts": parts[::-1]}
    r = await nodes.generate.post(GENERATE, json=swapped)
    assert r.status_code == 200, r.text[:500]
    assert logprobs(r.json()) != pytest.approx(logprobs(want), abs=1e-4)

    # Streamed, with OpenAI's nested image_url shape: the same tokens.
    nested = [{"type": "image_url", "image_url": {"url": p["url"]}} for p in parts]
    tokens: list[int] = []
    async with nodes.generate.stream(
        "POST", GENERATE, json={**body, "content_parts": nested, "stream": True}
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    tokens += choice["token_ids"] or []
    assert tokens == want["choices"][0]["token_ids"]


async def test_video_content_parts_generate_as_render_features_do(nodes):
    want, body = await as_render_features(nodes, ONE_VIDEO, [video(31)], "video")

    # The frames matter: another video is another prompt.
    r = await nodes.generate.post(GENERATE, json={**body, "content_parts": [video(32)]})
    assert r.status_code == 200, r.text[:500]
    assert logprobs(r.json()) != pytest.approx(logprobs(want), abs=1e-4)

    # An image and a video (OpenAI's nested shapes): each goes to its own modality's
    # placeholder, as render places them.
    parts = [image(33), video(31)]
    direct = await rendered(nodes, IMAGE_THEN_VIDEO, parts)
    r = await nodes.generate.post(GENERATE, json={**direct, "sampling_params": SAMPLING})
    assert r.status_code == 200, r.text[:500]
    want = r.json()
    nested = [{"type": p["type"], p["type"]: {"url": p["url"]}} for p in parts[::-1]]
    mixed = {**body, "token_ids": IMAGE_THEN_VIDEO, "content_parts": nested}
    r = await nodes.generate.post(GENERATE, json=mixed)
    assert r.status_code == 200, r.text[:500]
    got = r.json()
    assert got["prompt_token_ids"] == direct["token_ids"]
    assert set(got["mm_placeholders"]) == {"image", "video"}
    assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
    assert logprobs(got) == pytest.approx(logprobs(want), abs=1e-4)


async def test_client_round_trip_with_content_parts(nodes):
    want = await nodes.generate.post(
        GENERATE,
        json={"token_ids": ONE_IMAGE, "content_parts": [image(21)], "sampling_params": SAMPLING},
    )
    assert want.status_code == 200, want.text[:500]
    for binary in (True, False):
        async with AsyncTandemClient(
            "http://render", "http://generate", binary=binary, transport=HostRouter(nodes.apps)
        ) as client:
            request = GenerateRequest(
                token_ids=ONE_IMAGE, content_parts=[image(21)], sampling_params=SAMPLING
            )
            answer = await client.generate(request)
        assert answer.choices[0].token_ids == want.json()["choices"][0]["token_ids"]


def body_with(**fields) -> dict:
    return {"token_ids": ONE_IMAGE, "sampling_params": SAMPLING, **fields}


HOSTILE = {
    "not a list": (body_with(content_parts="x"), 400, "invalid_request", None),
    "not objects": (body_with(content_parts=[1]), 400, "invalid_request", None),
    "url not a string": (
        body_with(content_parts=[{"type": "image_url", "url": 5}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "no url (uuid only)": (
        body_with(content_parts=[{"type": "image_url", "uuid": "abc"}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "url twice": (
        body_with(content_parts=[{**image(1), "image_url": {"url": "data:,"}}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "type not a string": (
        body_with(content_parts=[{"type": 3, "url": "data:,"}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "text part": (
        body_with(content_parts=[image(1), {"type": "text", "text": "hi"}]),
        400,
        "invalid_request",
        "content_parts[1]",
    ),
    "input_audio part": (
        body_with(content_parts=[{"type": "input_audio", "input_audio": {"data": "AA=="}}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "video part without its url": (
        body_with(content_parts=[{"type": "video_url", "video_url": {"uuid": "v"}}]),
        400,
        "invalid_request",
        "content_parts[0]",
    ),
    "not a video": (
        body_with(content_parts=[{"type": "video_url", "url": "data:video/mp4;base64,AA=="}]),
        400,
        "invalid_media",
        "content_parts",
    ),
    "video at a loopback URL": (
        body_with(content_parts=[{"type": "video_url", "url": "http://127.0.0.1:1/v.mp4"}]),
        403,
        "media_url_forbidden",
        "content_parts",
    ),
    # Counted before anything is fetched, as vllm serve counts it: this model takes no audio.
    "audio for a model that takes none": (
        body_with(
            content_parts=[{"type": "audio_url", "url": "http://169.254.169.254/latest/a.wav"}]
        ),
        400,
        "BadRequestError",
        "content_parts",
    ),
    "more videos than render takes": (
        {**body_with(content_parts=[video(1), video(2)]), "token_ids": ONE_VIDEO},
        400,
        "BadRequestError",
        "content_parts",
    ),
    "more parts than items": (
        body_with(content_parts=[image(1)] * 33),
        400,
        "too_many_items",
        "content_parts",
    ),
    "loopback URL": (
        body_with(content_parts=[{"type": "image_url", "url": "http://127.0.0.1:1/x.png"}]),
        403,
        "media_url_forbidden",
        "content_parts",
    ),
    "cloud metadata URL": (
        body_with(
            content_parts=[{"type": "image_url", "url": "http://169.254.169.254/latest/x.png"}]
        ),
        403,
        "media_url_forbidden",
        "content_parts",
    ),
    "IPv4-mapped loopback URL": (
        body_with(content_parts=[{"type": "image_url", "url": "http://[::ffff:127.0.0.1]/x"}]),
        403,
        "media_url_forbidden",
        "content_parts",
    ),
    "local file": (
        body_with(content_parts=[{"type": "image_url", "url": "file:///etc/passwd"}]),
        400,
        "media_scheme_not_allowed",
        "content_parts",
    ),
    "not an image": (
        body_with(content_parts=[{"type": "image_url", "url": "data:image/png;base64,AAAA"}]),
        400,
        "invalid_image",
        "content_parts",
    ),
    "no placeholder in the prompt": (
        {**body_with(content_parts=[image(1)]), "token_ids": [1017, 359, 261, 198, 82]},
        400,
        "BadRequestError",
        "content_parts",
    ),
    "token out of vocabulary": (
        {**body_with(content_parts=[image(1)]), "token_ids": [*ONE_IMAGE, 10**9]},
        400,
        "token_out_of_vocabulary",
        "content_parts",
    ),
}


async def test_hostile_content_parts_are_typed_refusals_and_the_node_keeps_serving(
    nodes, qwen2_dir
):
    for name, (body, status, type_, param) in HOSTILE.items():
        r = await nodes.generate.post(GENERATE, json=body)
        assert (r.status_code, r.json()["error"]["type"]) == (status, type_), (name, r.text)
        assert r.json()["error"].get("param") == param, (name, r.text)

    # content_parts with features: refused by the wire decoder, whichever comes first.
    features = (await rendered(nodes, ONE_IMAGE, [image(1)]))["features"]
    both = body_with(content_parts=[image(1)], features=features)
    r = await nodes.generate.post(GENERATE, json=both)
    assert (r.status_code, r.json()["error"]["type"]) == (400, "invalid_request")
    assert "mutually exclusive" in r.json()["error"]["message"]

    ok = await nodes.generate.post(GENERATE, json=body_with(content_parts=[image(1)]))
    assert ok.status_code == 200, ok.text[:500]
    assert len(ok.json()["choices"][0]["token_ids"]) == SAMPLING["max_tokens"]


async def test_without_a_render_node_content_parts_are_refused_naming_the_flag(
    qwen2_engine, qwen2_dir
):
    app = generate_app(qwen2_engine, qwen2_dir)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            r = await c.post(GENERATE, json=body_with(content_parts=[image(1)]))
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request", "content_parts")
    assert "--content-parts-render-url" in error["message"]


async def answer_with(engine, model: str, settings: dict, transport=None) -> httpx.Response:
    app = generate_app(engine, model, render_transport=transport, **settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://g"
        ) as c:
            return await c.post(GENERATE, json=body_with(content_parts=[image(1)]))


async def test_render_out_of_reach_or_failing_is_a_5xx(qwen2_engine, qwen2_dir):
    # Nothing listens on port 1: connection refused, retried once, then 503.
    r = await answer_with(
        qwen2_engine, qwen2_dir, {"content_parts_render_url": "http://127.0.0.1:1"}
    )
    assert (r.status_code, r.json()["error"]["type"]) == (503, "upstream_unavailable")
    assert "retry-after" in r.headers

    seen: list[httpx.Request] = []

    def failing(status: int, type_: str):
        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            error = {"error": {"type": type_, "message": "m", "code": status}}
            return httpx.Response(status, json=error)

        return httpx.MockTransport(answer)

    settings = {
        "content_parts_render_url": "http://render",
        "content_parts_render_api_key": "render-key",
    }
    for status, type_, want in (
        (500, "internal_error", (502, "upstream_error")),
        (401, "unauthorized", (502, "upstream_error")),  # this node's key, not the caller's
        (503, "shutting_down", (503, "upstream_unavailable")),
        (422, "media_fetch_failed", (422, "media_fetch_failed")),
    ):
        r = await answer_with(qwen2_engine, qwen2_dir, settings, failing(status, type_))
        assert (r.status_code, r.json()["error"]["type"]) == want, (status, r.text)
    assert seen and all(s.headers["authorization"] == "Bearer render-key" for s in seen)
    assert {s.url.path for s in seen} == {"/v1/completions/render"}
