"""Audio on the generate side (tiny Qwen2-Audio): render -> generate gives vLLM's own chat
tokens and logprobs for the same clips, JSON and binary; items that would break the encoder are
refused with a typed 400 and the engine keeps serving."""

from __future__ import annotations

import io

import msgspec
import numpy as np
import pytest

from tandem_wire import BatchedLayout, FieldElem, GenerateRequest, decode_item, encode_item

from ...support.asgi import app_client
from ...support.audio import audio_bytes, audio_chat, audio_url_part, input_audio_part
from ...support.images import data_url
from ...support.vllm_chat import generate_steps
from .helpers import cpu_engine, generate_app, post
from .parity import GREEDY_WITH_LOGPROBS, assert_same_steps, ours, reference

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]


@pytest.fixture(scope="module")
async def qwen2_audio_engine(qwen2_audio_dir, anyio_backend):
    """The session's one Qwen2-Audio engine (only this module starts it; stopped after it)."""
    engine = cpu_engine(qwen2_audio_dir)
    yield engine
    engine.shutdown()


async def test_audio_equals_vllm_chat(qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir):
    model = qwen2_audio_dir
    body = audio_chat(model, [input_audio_part(audio_bytes(2.0, seed=1))])
    expected = await reference(qwen2_audio_engine, model, body)
    answers, rendered = await ours(qwen2_audio_engine, qwen2_audio_renderer, model, body)
    assert [p.length for p in rendered.features.mm_placeholders["audio"]] == [50]
    assert len(expected) == GREEDY_WITH_LOGPROBS["max_tokens"]
    assert_same_steps(answers["json"], expected)
    assert_same_steps(answers["binary"], expected)
    # Another clip answers otherwise: the comparison above is of the audio, not of the text.
    other_body = audio_chat(model, [input_audio_part(audio_bytes(2.0, seed=2))])
    other = await reference(qwen2_audio_engine, model, other_body)
    assert [s[1] for s in other] != [s[1] for s in expected]


async def test_two_clips_by_input_audio_and_audio_url_equal_vllm_chat(
    qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir
):
    model = qwen2_audio_dir
    parts = [
        audio_url_part(data_url(audio_bytes(1.0, seed=3, fmt="FLAC"), "audio/flac")),
        input_audio_part(audio_bytes(3.0, seed=4)),
    ]
    body = audio_chat(model, parts)
    expected = await reference(qwen2_audio_engine, model, body)
    answers, rendered = await ours(qwen2_audio_engine, qwen2_audio_renderer, model, body)
    assert [p.length for p in rendered.features.mm_placeholders["audio"]] == [25, 75]
    assert_same_steps(answers["json"], expected)
    assert_same_steps(answers["binary"], expected)


async def test_a_44k_stereo_clip_equals_vllm_chat_of_it_at_16k(
    qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir
):
    # vLLM resamples with torchaudio, which has no build for this torch, so its own server
    # takes only clips already at 16 kHz here; the reference is the clip downmixed and
    # resampled with vLLM's scipy method (what render does), sent as float samples.
    import soundfile
    from vllm.multimodal.audio import resample_audio_scipy

    model, clip = qwen2_audio_dir, audio_bytes(1.5, 44_100, seed=5, channels=2)
    wave, rate = soundfile.read(io.BytesIO(clip), dtype="float32")
    at_16k = resample_audio_scipy(wave.mean(axis=1), orig_sr=rate, target_sr=16_000)
    buf = io.BytesIO()
    soundfile.write(buf, at_16k.astype(np.float32), 16_000, format="WAV", subtype="FLOAT")
    expected = await reference(
        qwen2_audio_engine, model, audio_chat(model, [input_audio_part(buf.getvalue())])
    )
    answers, _ = await ours(
        qwen2_audio_engine, qwen2_audio_renderer, model, audio_chat(model, [input_audio_part(clip)])
    )
    assert_same_steps(answers["json"], expected)
    assert_same_steps(answers["binary"], expected)


def with_item(req: GenerateRequest, **fields: np.ndarray) -> GenerateRequest:
    """The request with its audio item's fields replaced (batched, as the processor lays
    them out)."""
    item = dict(decode_item(req.features.kwargs_data["audio"][0]))
    for key, data in fields.items():
        item[key] = FieldElem(data, BatchedLayout())
    feats = msgspec.structs.replace(req.features, kwargs_data={"audio": [encode_item(item)]})
    return msgspec.structs.replace(req, features=feats)


async def test_items_that_would_break_the_encoder_are_refused(
    qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir
):
    model = qwen2_audio_dir
    body = audio_chat(model, [input_audio_part(audio_bytes(2.0, seed=6))])
    _, req = await ours(qwen2_audio_engine, qwen2_audio_renderer, model, body)
    item = decode_item(req.features.kwargs_data["audio"][0])
    mask = np.asarray(item["feature_attention_mask"].data)
    features = np.asarray(item["input_features"].data)
    cases = {
        # Twos count double: the encoder would emit more embeddings than the run holds.
        "mask of twos": (with_item(req, feature_attention_mask=mask * 2), "invalid_mm_item"),
        "negative mask": (with_item(req, feature_attention_mask=-mask), "invalid_mm_item"),
        "empty mask": (with_item(req, feature_attention_mask=mask * 0), "invalid_mm_item"),
        "short window": (with_item(req, input_features=features[:, :1000]), "invalid_mm_item"),
        "mask of another length": (
            with_item(req, feature_attention_mask=np.minimum(mask + np.roll(mask, 100), 1)),
            "invalid_placeholders",
        ),
    }
    async with app_client(generate_app(qwen2_audio_engine, model)) as c:
        for name, (bad, kind) in cases.items():
            err = await post(c, bad, expect=400)
            assert err["error"]["type"] == kind, (name, err)
        # The engine never saw them: the same node still answers the real item.
        good = generate_steps(await post(c, req))
    assert len(good) == GREEDY_WITH_LOGPROBS["max_tokens"]


def example_media_parts():
    """examples/media_parts.py, the content parts the README and the examples show."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "media_parts.py"
    spec = importlib.util.spec_from_file_location("media_parts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_examples_audio_part_equals_vllm_chat(
    qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir
):
    model = qwen2_audio_dir
    body = {"model": model, "messages": [example_media_parts().user_message("audio")]}
    expected = await reference(qwen2_audio_engine, model, body)
    answers, _ = await ours(qwen2_audio_engine, qwen2_audio_renderer, model, body)
    assert_same_steps(answers["json"], expected)


async def test_the_client_chats_with_audio(
    qwen2_audio_engine, qwen2_audio_renderer, qwen2_audio_dir
):
    # tandem_client passes audio parts on as they are: base64 in input_audio, or raw bytes in
    # audio_bytes (its msgpack bodies carry them without base64).
    from .helpers import client_stack

    model, clip = qwen2_audio_dir, audio_bytes(2.0, seed=7)
    expected = await reference(
        qwen2_audio_engine, model, audio_chat(model, [input_audio_part(clip)])
    )
    parts = {
        "input_audio": input_audio_part(clip),
        "audio_bytes": {"type": "audio_bytes", "audio_bytes": clip},
    }
    async with client_stack(qwen2_audio_engine, qwen2_audio_renderer, model) as client:
        for name, part in parts.items():
            messages = audio_chat(model, [part])["messages"]
            answer = await client.chat(messages, temperature=0.0, max_tokens=8)
            assert answer.choices[0].token_ids == [t for t, _, _ in expected], name
