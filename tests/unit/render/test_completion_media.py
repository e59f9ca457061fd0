"""Videos and audio clips on render's completion route (our ``videos`` / ``audios`` fields):
a token prompt holding each item's placeholder once renders to exactly what the chat route
gives for the same media (tokens, placeholders, hashes, item bytes), under the same media
policy and limits."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import numpy as np
import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_wire import WireFormat, decode_generate_request, decode_generate_requests, decode_item

from ...support.asgi import app_client
from ...support.audio import audio_bytes, audio_chat, audio_url_part
from ...support.images import data_url, mp4_bytes, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

CHAT = "/v1/chat/completions/render"
COMPLETION = "/v1/completions/render"
MSGPACK = "application/vnd.msgpack"


def settings_for(model: str, **overrides) -> RenderSettings:
    base = RenderSettings(
        model=model,
        max_audios_per_prompt=4,
        max_images_per_prompt=4,
        max_videos_per_prompt=4,
        pretouch_cache_memory=False,
    )
    return replace(base, **overrides)


async def post(renderer, model, path, body, *, binary=False, **overrides):
    app = create_app(settings_for(model, **overrides), renderer=renderer)
    async with app_client(app) as c:
        if binary:
            return await c.post(
                path,
                content=msgspec.msgpack.encode(body),
                headers={"content-type": MSGPACK, "accept": MSGPACK},
            )
        return await c.post(path, json=body)


async def chat_render(renderer, model, body):
    r = await post(renderer, model, CHAT, body)
    assert r.status_code == 200, r.text[:1000]
    return decode_generate_request(r.content, WireFormat.JSON)


async def completion_render(renderer, model, body, *, binary=False):
    r = await post(renderer, model, COMPLETION, body, binary=binary)
    assert r.status_code == 200, r.text[:1000]
    return decode_generate_requests(r.content, WireFormat.MSGPACK if binary else WireFormat.JSON)


def collapsed(req) -> list[int]:
    """The rendered prompt with each placeholder run back to its one token, as a caller
    (or upstream's content_parts) writes a token prompt."""
    runs = sorted(
        ((p.offset, p.length) for ps in req.features.mm_placeholders.values() for p in ps),
        reverse=True,
    )
    ids = list(req.token_ids)
    for offset, length in runs:
        assert len(set(ids[offset : offset + length])) == 1  # a run of one pad token
        del ids[offset + 1 : offset + length]
    return ids


def items(req, modality) -> list[dict]:
    return [
        {k: np.asarray(v.data).tobytes() for k, v in decode_item(e).items()}
        for e in req.features.kwargs_data[modality]
    ]


def placeholders(req) -> dict:
    return {m: [(p.offset, p.length) for p in ps] for m, ps in req.features.mm_placeholders.items()}


def assert_same_render(got, want, modalities):
    assert got.token_ids == want.token_ids
    assert placeholders(got) == placeholders(want)
    assert got.features.mm_hashes == want.features.mm_hashes
    for m in modalities:
        assert items(got, m) == items(want, m), m


def video_chat(model, parts):
    return {"model": model, "messages": [{"role": "user", "content": [*parts, _TEXT]}]}


_TEXT = {"type": "text", "text": "what happens?"}


def video_part(url):
    return {"type": "video_url", "video_url": {"url": url}}


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


async def test_a_video_renders_as_the_chat_route_renders_it(qwen2_renderer, qwen2_dir):
    video = mp4_bytes(seed=3)
    want = await chat_render(
        qwen2_renderer, qwen2_dir, video_chat(qwen2_dir, [video_part(data_url(video, "video/mp4"))])
    )
    prompt = collapsed(want)
    assert prompt.count(1023) == 1 and len(prompt) < len(want.token_ids)
    body = {"model": qwen2_dir, "prompt": prompt, "max_tokens": 1}
    (got,) = await completion_render(
        qwen2_renderer, qwen2_dir, {**body, "videos": [[data_url(video, "video/mp4")]]}
    )
    assert_same_render(got, want, ["video"])
    assert set(got.features.mm_placeholders) == {"video"}
    # Raw bytes in msgpack: the same item.
    (raw,) = await completion_render(
        qwen2_renderer, qwen2_dir, {**body, "videos": [[video]]}, binary=True
    )
    assert raw.features.mm_hashes == want.features.mm_hashes
    assert raw.token_ids == want.token_ids
    # The frames matter: another video is another item.
    (other,) = await completion_render(
        qwen2_renderer, qwen2_dir, {**body, "videos": [[data_url(mp4_bytes(seed=4))]]}
    )
    assert other.features.mm_hashes != want.features.mm_hashes


async def test_images_and_a_video_in_one_prompt_follow_their_placeholders(
    qwen2_renderer, qwen2_dir
):
    a, b = data_url(png_bytes(seed=1)), data_url(png_bytes(56, 84, seed=2))
    video = data_url(mp4_bytes(seed=5), "video/mp4")
    want = await chat_render(
        qwen2_renderer,
        qwen2_dir,
        video_chat(qwen2_dir, [image_part(a), video_part(video), image_part(b)]),
    )
    body = {
        "model": qwen2_dir,
        "prompt": collapsed(want),
        "images": [[a, b]],
        "videos": [[video]],
        "max_tokens": 1,
    }
    (got,) = await completion_render(qwen2_renderer, qwen2_dir, body)
    assert_same_render(got, want, ["image", "video"])
    # The images' order is the order of the image placeholders: swapped, they swap.
    (swapped,) = await completion_render(qwen2_renderer, qwen2_dir, {**body, "images": [[b, a]]})
    assert swapped.features.mm_hashes["image"] == want.features.mm_hashes["image"][::-1]
    assert swapped.features.mm_hashes["video"] == want.features.mm_hashes["video"]


async def test_audio_clips_render_as_the_chat_route_renders_them(
    qwen2_audio_renderer, qwen2_audio_dir
):
    model = qwen2_audio_dir
    one, two = audio_bytes(1.0, seed=3), audio_bytes(2.0, 44_100, seed=4)  # resampled
    urls = [data_url(one, "audio/wav"), data_url(two, "audio/wav")]
    want = await chat_render(
        qwen2_audio_renderer, model, audio_chat(model, [audio_url_part(u) for u in urls])
    )
    assert [n for _, n in placeholders(want)["audio"]] == [25, 50]
    body = {"model": model, "prompt": collapsed(want), "max_tokens": 1}
    (got,) = await completion_render(qwen2_audio_renderer, model, {**body, "audios": [urls]})
    assert_same_render(got, want, ["audio"])
    (raw,) = await completion_render(
        qwen2_audio_renderer, model, {**body, "audios": [[one, two]]}, binary=True
    )
    assert raw.features.mm_hashes == want.features.mm_hashes
    # In the order given: swapped, the clips swap (and so do their lengths).
    (swapped,) = await completion_render(
        qwen2_audio_renderer, model, {**body, "audios": [urls[::-1]]}
    )
    assert swapped.features.mm_hashes["audio"] == want.features.mm_hashes["audio"][::-1]
    assert [n for _, n in placeholders(swapped)["audio"]] == [50, 25]


async def test_several_prompts_each_with_their_own_media(qwen2_audio_renderer, qwen2_audio_dir):
    model = qwen2_audio_dir
    clip = data_url(audio_bytes(1.0, seed=6), "audio/wav")
    want = await chat_render(qwen2_audio_renderer, model, audio_chat(model, [audio_url_part(clip)]))
    prompt = collapsed(want)
    text_only = [t for t in prompt if t != 1023]
    body = {"model": model, "prompt": [text_only, prompt], "audios": [None, [clip]]}
    plain, with_audio = await completion_render(qwen2_audio_renderer, model, body)
    assert plain.features is None and plain.token_ids == text_only
    assert with_audio.token_ids == want.token_ids
    assert with_audio.features.mm_hashes == want.features.mm_hashes


VIDEO_PROMPT = [1017, 359, 261, 198, 1019, 1023, 1020, 82, 1018, 198, 1017, 436, 198]
"""A Qwen2-VL chat prompt as token ids with one <|video_pad|>."""


def video_body(model, videos, **extra):
    return {"model": model, "prompt": VIDEO_PROMPT, "videos": videos, **extra}


HOSTILE_VIDEOS = {
    "not a list": ("x", 400, "invalid_request", "videos"),
    "not one entry per prompt": ([[], []], 400, "invalid_request", "videos"),
    "entry not a list": (["data:,"], 400, "invalid_request", "videos"),
    "item not a URL": ([[5]], 400, "invalid_request", "videos[0][0]"),
    "item without a url": ([[{"uuid": "someone-elses"}]], 400, "invalid_request", "videos[0][0]"),
    "loopback": ([["http://127.0.0.1:1/v.mp4"]], 403, "media_url_forbidden", None),
    "cloud metadata": ([["http://169.254.169.254/latest/v.mp4"]], 403, "media_url_forbidden", None),
    "mapped loopback": ([["http://[::ffff:127.0.0.1]/v.mp4"]], 403, "media_url_forbidden", None),
    "local file": ([["file:///etc/passwd"]], 400, "media_scheme_not_allowed", None),
    "not a video": ([[data_url(b"\x00" * 64, "video/mp4")]], 400, "invalid_media", None),
    "more videos than the limit": (
        [[data_url(mp4_bytes(seed=1))] * 5],
        400,
        "BadRequestError",
        "video",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_VIDEOS))
async def test_hostile_videos_are_typed_refusals(qwen2_renderer, qwen2_dir, name):
    videos, status, type_, param = HOSTILE_VIDEOS[name]
    r = await post(qwen2_renderer, qwen2_dir, COMPLETION, video_body(qwen2_dir, videos))
    assert (r.status_code, r.json()["error"]["type"]) == (status, type_), r.text[:500]
    assert r.json()["error"].get("param") == param, r.text[:500]


async def test_a_video_without_its_placeholder_is_refused(qwen2_renderer, qwen2_dir):
    body = video_body(qwen2_dir, [[data_url(mp4_bytes(seed=1))]], prompt=[1017, 359, 261, 198])
    r = await post(qwen2_renderer, qwen2_dir, COMPLETION, body)
    assert (r.status_code, r.json()["error"]["type"]) == (400, "BadRequestError"), r.text[:500]


async def test_a_video_over_a_limit_is_refused_from_its_header(qwen2_renderer, qwen2_dir):
    # The chat route's header check: 8 frames of 112x112 against a budget of fewer bytes.
    saved = qwen2_renderer.video_limits
    qwen2_renderer.video_limits = replace(saved, max_decoded_bytes=8 * 112 * 112 * 3 - 1)
    try:
        body = video_body(qwen2_dir, [[data_url(mp4_bytes(seed=1))]])
        r = await post(qwen2_renderer, qwen2_dir, COMPLETION, body)
    finally:
        qwen2_renderer.video_limits = saved
    assert (r.status_code, r.json()["error"]["type"]) == (413, "media_too_large"), r.text[:500]


@pytest.mark.parametrize(
    ("audios", "status", "type_"),
    [
        ([["http://127.0.0.1:1/a.wav"]], 403, "media_url_forbidden"),
        ([["http://169.254.169.254/a.wav"]], 403, "media_url_forbidden"),
        ([["file:///etc/passwd"]], 400, "media_scheme_not_allowed"),
        ([[data_url(b"RIFF\x00\x00\x00\x00WAVEjunk" * 4, "audio/wav")]], 400, "invalid_media"),
        ([[{"url": 3}]], 400, "invalid_request"),
        (
            [[data_url(audio_bytes(0.5, seed=s), "audio/wav") for s in range(3)]],
            400,
            "BadRequestError",
        ),
        ({"0": []}, 400, "invalid_request"),
    ],
)
async def test_hostile_audio_clips_are_typed_refusals(
    qwen2_audio_renderer, qwen2_audio_dir, audios, status, type_
):
    model = qwen2_audio_dir
    prompt = collapsed(
        await chat_render(
            qwen2_audio_renderer,
            model,
            audio_chat(model, [audio_url_part(data_url(audio_bytes(0.5), "audio/wav"))]),
        )
    )
    body = {"model": model, "prompt": prompt, "audios": audios}
    r = await post(qwen2_audio_renderer, model, COMPLETION, body, max_audios_per_prompt=2)
    assert (r.status_code, r.json()["error"]["type"]) == (status, type_), r.text[:500]
