"""Parity: our render JSON equals upstream `vllm launch render`'s for the same request, field for
field; where we differ on purpose (is_embed, max_tokens always written, random ids) the test
asserts the exact difference."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest

from tandem_wire import (
    WireFormat,
    decode_generate_request,
)
from tools.servers import tandem_render, upstream_render
from tools.tiny_models import ensure_model

from ..support.audio import audio_bytes, audio_chat, audio_url_part, input_audio_part
from ..support.images import chat_body, data_url, mp4_bytes, png_bytes
from ..support.render_compare import assert_same_request, post, post_json

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

MODELS = ["qwen2-vl", "qwen3-vl"]


@pytest.fixture(scope="module", params=MODELS)
def servers(request):
    model = str(ensure_model(request.param))
    with upstream_render(model) as upstream, tandem_render(model, workers=2) as ours:
        upstream.wait_healthy()
        ours.wait_healthy()
        yield model, upstream.url, ours.url


SALT = "parity-salt-" + "x" * 20

CHAT_CASES = {
    "one image, caller's id, salt, priority": lambda m: chat_body(
        m,
        [data_url(png_bytes(seed=21))],
        max_tokens=9,
        request_id="parity-1",
        cache_salt=SALT,
        priority=3,
        return_token_ids=True,
    ),
    "three images, transfer params": lambda m: chat_body(
        m,
        [data_url(png_bytes(224, 160, seed=s)) for s in (22, 23, 22)],
        temperature=0.5,
        kv_transfer_params={"do_remote_decode": True},
        ec_transfer_params={"do_remote_encode": True},
    ),
    "text only, offsets, stream": lambda m: {
        "model": m,
        "messages": [{"role": "user", "content": "hello"}],
        "return_token_offsets": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": SALT,
        "priority": -2,
    },
    "system and chat_template_kwargs": lambda m: {
        "model": m,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "chat_template_kwargs": {"add_vision_id": True},
        "add_generation_prompt": True,
        "seed": 3,
        "n": 2,
    },
    "video": lambda m: {
        "model": m,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": data_url(mp4_bytes(), "video/mp4")}},
                    {"type": "text", "text": "what?"},
                ],
            }
        ],
    },
}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_render_matches_upstream(servers, case):
    model, upstream, ours = servers
    body = CHAT_CASES[case](model)
    path = "/v1/chat/completions/render"
    mine = post_json(ours, path, body)
    assert_same_request(mine, post_json(upstream, path, body), model)
    # What the caller set reached our answer (the comparison above is not of defaults alone).
    assert mine["cache_salt"] == body.get("cache_salt")
    assert mine["priority"] == body.get("priority", 0)
    assert (mine["token_offsets"] is not None) == bool(body.get("return_token_offsets"))


COMPLETION_BODY = {
    "max_tokens": 4,
    "logprobs": 2,
    "cache_salt": SALT,
    "priority": 1,
    "return_token_offsets": True,
    "return_token_ids": True,
}


@pytest.mark.parametrize(
    "prompt", [[1, 2, 3, 4], [[5, 6], [7, 8, 9]], "the quick brown fox", ["a b", "c d e"]]
)
def test_completion_render_matches_upstream(servers, prompt):
    model, upstream, ours = servers
    body = {"model": model, "prompt": prompt, **COMPLETION_BODY}
    path = "/v1/completions/render"
    theirs, mine = post_json(upstream, path, body), post_json(ours, path, body)
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert_same_request(a, b, model)
        assert (a["cache_salt"], a["priority"]) == (SALT, 1)
        assert (a["token_offsets"] is not None) == isinstance(prompt[0], str)


def test_completion_default_max_tokens_is_written(servers):
    # A completion's default max_tokens (16) equals SamplingParams' default: upstream leaves it
    # out of the document, ours writes it.
    model, upstream, ours = servers
    body = {"model": model, "prompt": "the quick brown fox"}
    path = "/v1/completions/render"
    (theirs,), (mine,) = post_json(upstream, path, body), post_json(ours, path, body)
    assert "max_tokens" not in theirs["sampling_params"]
    assert_same_request(mine, theirs, model)
    assert mine["sampling_params"]["max_tokens"] == 16


def test_our_binary_answer_carries_the_same_items(servers):
    model, _, ours = servers
    body = chat_body(model, [data_url(png_bytes(seed=24))])
    path = "/v1/chat/completions/render"
    as_json = post(ours, path, body)
    r = httpx.post(
        ours + path, json=body, headers={"accept": "application/vnd.msgpack"}, timeout=60
    )
    assert r.status_code == 200
    # The same answer, field for field (items as base64 of the very same bytes), but its id.
    binary = msgspec.to_builtins(decode_generate_request(r.content, WireFormat.MSGPACK))
    assert {**binary, "request_id": None} == {**json.loads(as_json), "request_id": None}
    assert len(r.content) < len(as_json) * 0.8  # no base64


@pytest.fixture(scope="module")
def audio_servers():
    """Upstream's and our render on the tiny Qwen2-Audio (no engine: render only)."""
    model = str(ensure_model("qwen2-audio"))
    with upstream_render(model) as upstream, tandem_render(model) as ours:
        upstream.wait_healthy()
        ours.wait_healthy()
        yield model, upstream.url, ours.url


def test_audio_render_matches_upstream(audio_servers):
    # Clips at the model's rate (16 kHz), where vLLM's own render needs no resampler.
    model, upstream, ours = audio_servers
    parts = [
        input_audio_part(audio_bytes(2.0, seed=11)),
        audio_url_part(data_url(audio_bytes(1.0, seed=12, fmt="FLAC"), "audio/flac")),
    ]
    body = audio_chat(model, parts, max_tokens=5, cache_salt=SALT)
    path = "/v1/chat/completions/render"
    mine = post_json(ours, path, body)
    assert_same_request(mine, post_json(upstream, path, body), model)
    assert [p["length"] for p in mine["features"]["mm_placeholders"]["audio"]] == [50, 25]
