"""Audio through the render app (tiny Qwen2-Audio): every content part vLLM's chat API takes,
resampling to the model's rate, and the clip limits checked from the header before decoding."""

from __future__ import annotations

import io
from dataclasses import replace

import msgspec
import numpy as np
import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_wire import WireFormat, decode_generate_request, decode_item

from ...support.asgi import app_client
from ...support.audio import audio_bytes, audio_chat, audio_url_part, input_audio_part
from ...support.images import data_url

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

AUDIO_PAD = 1023
MSGPACK = "application/vnd.msgpack"
PATH = "/v1/chat/completions/render"


def settings_for(model: str, **overrides) -> RenderSettings:
    base = RenderSettings(model=model, max_audios_per_prompt=4, pretouch_cache_memory=False)
    return replace(base, **overrides)


async def render(renderer, model, body, *, binary=False, expect=200, **overrides):
    app = create_app(settings_for(model, **overrides), renderer=renderer)
    async with app_client(app) as c:
        if binary:
            r = await c.post(
                PATH,
                content=msgspec.msgpack.encode(body),
                headers={"content-type": MSGPACK, "accept": MSGPACK},
            )
        else:
            r = await c.post(PATH, json=body)
    assert r.status_code == expect, r.text[:1000]
    if expect != 200:
        return r.json()["error"]
    return decode_generate_request(r.content, WireFormat.MSGPACK if binary else WireFormat.JSON)


def items_of(req) -> list[dict]:
    return [
        {k: np.asarray(v.data).tobytes() for k, v in decode_item(e).items()}
        for e in req.features.kwargs_data["audio"]
    ]


async def test_every_audio_part_renders_the_same_clip_alike(qwen2_audio_renderer, qwen2_audio_dir):
    model, clip = qwen2_audio_dir, audio_bytes(2.0, seed=1)
    forms = {
        "input_audio": (audio_chat(model, [input_audio_part(clip)]), False),
        "audio_url data": (audio_chat(model, [audio_url_part(data_url(clip, "audio/wav"))]), False),
        "audio_bytes": (
            audio_chat(model, [{"type": "audio_bytes", "audio_bytes": clip}]),
            True,
        ),
        "flac": (
            audio_chat(model, [input_audio_part(audio_bytes(2.0, seed=1, fmt="FLAC"), "flac")]),
            False,
        ),
    }
    answers = {}
    for name, (body, binary) in forms.items():
        answers[name] = await render(qwen2_audio_renderer, model, body, binary=binary)
    first = answers["input_audio"]
    (ph,) = first.features.mm_placeholders["audio"]
    # 2 s -> 200 mel frames -> 100 -> 50 embeddings (the encoder's two stride-2 steps).
    assert ph.length == 50 and ph.is_embed is None
    assert first.token_ids[ph.offset : ph.offset + ph.length] == [AUDIO_PAD] * 50
    item = decode_item(first.features.kwargs_data["audio"][0])
    assert item["input_features"].data.shape == (128, 3000)
    assert str(item["input_features"].data.dtype) == "bfloat16"  # the model's dtype
    assert int(np.asarray(item["feature_attention_mask"].data).sum()) == 200
    for name, req in answers.items():
        assert req.token_ids == first.token_ids, name
        assert req.features.mm_hashes == first.features.mm_hashes, name
        assert items_of(req) == items_of(first), name


async def test_clips_at_other_rates_are_resampled_to_the_models(
    qwen2_audio_renderer, qwen2_audio_dir
):
    # A 44.1 kHz stereo clip renders exactly as the same clip downmixed and resampled by vLLM's
    # scipy resampler, sent as 16 kHz float samples.
    import soundfile
    from vllm.multimodal.audio import resample_audio_scipy

    model, clip = qwen2_audio_dir, audio_bytes(1.5, 44_100, seed=2, channels=2)
    wave, rate = soundfile.read(io.BytesIO(clip), dtype="float32")
    mono = wave.mean(axis=1)
    at_16k = resample_audio_scipy(mono, orig_sr=rate, target_sr=16_000).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, at_16k, 16_000, format="WAV", subtype="FLOAT")
    ours = await render(qwen2_audio_renderer, model, audio_chat(model, [input_audio_part(clip)]))
    ref = await render(
        qwen2_audio_renderer, model, audio_chat(model, [input_audio_part(buf.getvalue())])
    )
    (ph,) = ours.features.mm_placeholders["audio"]
    assert ph.length == 37  # 1.5 s -> 150 frames -> 75 -> 37
    assert ours.token_ids == ref.token_ids
    assert ours.features.mm_hashes == ref.features.mm_hashes
    assert items_of(ours) == items_of(ref)


async def test_two_clips_in_one_message(qwen2_audio_renderer, qwen2_audio_dir):
    model = qwen2_audio_dir
    parts = [input_audio_part(audio_bytes(1.0, seed=3)), input_audio_part(audio_bytes(2.0, seed=4))]
    req = await render(qwen2_audio_renderer, model, audio_chat(model, parts))
    assert [p.length for p in req.features.mm_placeholders["audio"]] == [25, 50]
    a, b = req.features.mm_hashes["audio"]
    assert a != b


@pytest.mark.parametrize(
    ("overrides", "clip", "words"),
    [
        ({"max_audio_seconds": 1.5}, {"seconds": 2.0}, "2 seconds, more than 1.5"),
        ({"max_audio_sample_rate": 22_050}, {"rate": 44_100}, "44100 Hz sample rate"),
        (
            {"max_decoded_audio_bytes": 2 * 16_000 * 2 * 4 - 1},
            {"seconds": 2.0, "channels": 2},
            "256000 bytes of decoded samples",
        ),
    ],
)
async def test_a_clip_over_a_limit_is_refused_from_its_header(
    qwen2_audio_renderer, qwen2_audio_dir, overrides, clip, words
):
    model = qwen2_audio_dir
    decoded = []
    real = qwen2_audio_renderer.render_chat

    async def spy(*args, **kwargs):
        decoded.append(1)
        return await real(*args, **kwargs)

    qwen2_audio_renderer.render_chat = spy
    try:
        body = audio_chat(model, [input_audio_part(audio_bytes(**clip))])
        err = await render(qwen2_audio_renderer, model, body, expect=413, **overrides)
    finally:
        del qwen2_audio_renderer.render_chat
    assert err["type"] == "media_too_large" and words in err["message"], err
    assert decoded == []  # refused before vLLM decoded a sample


@pytest.mark.parametrize(
    ("part", "status", "kind"),
    [
        (input_audio_part(b"RIFF\x00\x00\x00\x00WAVEjunk" * 4), 400, "invalid_media"),
        (input_audio_part(audio_bytes(0.5, 800)), 400, "invalid_media"),  # below 1 kHz
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav;x"}}, 400, None),
        ({"type": "input_audio", "input_audio": {"format": "wav"}}, 400, None),
        ({"type": "input_audio", "input_audio": "AAAA"}, 400, None),
        ({"type": "audio_embeds", "audio_embeds": "AAAA"}, 400, None),
        ({**input_audio_part(audio_bytes(0.5)), "uuid": "someone-elses"}, 400, None),
        (audio_url_part("http://127.0.0.1:1/a.wav"), 403, "media_url_forbidden"),
        (audio_url_part("file:///etc/passwd"), 400, "media_scheme_not_allowed"),
    ],
)
async def test_bad_audio_parts_get_typed_errors(
    qwen2_audio_renderer, qwen2_audio_dir, part, status, kind
):
    body = audio_chat(qwen2_audio_dir, [part])
    err = await render(qwen2_audio_renderer, qwen2_audio_dir, body, expect=status)
    assert err["type"] == (kind or "invalid_request"), err


async def test_too_many_clips(qwen2_audio_renderer, qwen2_audio_dir):
    parts = [input_audio_part(audio_bytes(0.5, seed=s)) for s in range(3)]
    body = audio_chat(qwen2_audio_dir, parts)
    err = await render(
        qwen2_audio_renderer, qwen2_audio_dir, body, expect=400, max_audios_per_prompt=2
    )
    assert err["type"] == "BadRequestError" and err["param"] == "audio"
    assert err["message"].startswith("At most 2 audio(s) may be provided in one prompt.")


async def test_file_audio_under_the_allowed_folder(qwen2_audio_renderer, qwen2_audio_dir, tmp_path):
    clip = audio_bytes(1.0, seed=5)
    (tmp_path / "clip.wav").write_bytes(clip)
    model = qwen2_audio_dir
    from_file = await render(
        qwen2_audio_renderer,
        model,
        audio_chat(model, [audio_url_part(f"file://{tmp_path}/clip.wav")]),
        allowed_local_media_path=str(tmp_path),
    )
    inline = await render(qwen2_audio_renderer, model, audio_chat(model, [input_audio_part(clip)]))
    assert from_file.features.mm_hashes == inline.features.mm_hashes


@pytest.mark.parametrize(
    "limits",
    [
        {"max_seconds": 1.0, "max_sample_rate": 192_000, "max_decoded_bytes": 2**30},
        {"max_seconds": 600.0, "max_sample_rate": 192_000, "max_decoded_bytes": 100_000},
    ],
)
def test_the_decoder_holds_a_clip_to_the_limits_too(limits):
    # The second line, for a header that lies: decoding stops at the limits as well.
    from vllm.multimodal.media import AudioMediaIO

    from tandem_render.errors import MediaTooLarge
    from tandem_render.media import AudioDecoding, AudioLimits
    from tandem_render.media_connector import decode_audio

    how = AudioDecoding(limits=AudioLimits(**limits), sample_rate=16_000)
    with pytest.raises(MediaTooLarge):
        decode_audio(AudioMediaIO(), audio_bytes(2.0, seed=8), how)
    wave, rate = decode_audio(AudioMediaIO(), audio_bytes(0.5, 8_000, seed=8), how)
    assert rate == 16_000 and wave.dtype == np.float32 and wave.shape == (8_000,)
