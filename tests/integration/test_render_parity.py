"""Parity: our render JSON equals upstream `vllm launch render`'s for the same request."""

from __future__ import annotations

import httpx
import pytest

from tandem_wire import WireFormat, decode_generate_request, decode_generate_requests, decode_item
from tools.servers import tandem_render, upstream_render
from tools.tiny_models import ensure_model

from ..support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

MODELS = ["qwen2-vl", "qwen3-vl"]


@pytest.fixture(scope="module", params=MODELS)
def servers(request):
    model = str(ensure_model(request.param))
    upstream, ours = upstream_render(model), tandem_render(model, workers=2)
    try:
        upstream.wait_healthy()
        ours.wait_healthy()
        yield model, upstream.url, ours.url
    finally:
        upstream.stop()
        ours.stop()


def post(url: str, path: str, body: dict) -> bytes:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text[:2000]
    return r.content


def assert_items_equal(a: bytes | None, b: bytes | None) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    x, y = decode_item(a), decode_item(b)
    assert sorted(x) == sorted(y)  # key order is not meaningful (vLLM's own cache changes it)
    for key in x:
        assert x[key].layout == y[key].layout, key
        assert x[key].data.dtype == y[key].data.dtype and x[key].data.shape == y[key].data.shape
        assert x[key].data.tobytes() == y[key].data.tobytes(), key


def assert_same_request(ours, theirs) -> None:
    assert ours.token_ids == theirs.token_ids
    assert ours.sampling_params == theirs.sampling_params
    assert ours.model == theirs.model
    if theirs.features is None:
        assert ours.features is None
        return
    of, tf = ours.features, theirs.features
    assert of.mm_hashes == tf.mm_hashes
    assert {m: [(p.offset, p.length) for p in v] for m, v in of.mm_placeholders.items()} == {
        m: [(p.offset, p.length) for p in v] for m, v in tf.mm_placeholders.items()
    }
    for name in ("kwargs_data", "mm_metadata"):
        mine, upstream = getattr(of, name), getattr(tf, name)
        assert (mine is None) == (upstream is None), name
        for modality in upstream or {}:
            for a, b in zip(mine[modality], upstream[modality], strict=True):
                assert_items_equal(a, b)


CHAT_CASES = {
    "one image": lambda m: chat_body(m, [data_url(png_bytes(seed=21))], max_tokens=9),
    "three images": lambda m: chat_body(
        m, [data_url(png_bytes(224, 160, seed=s)) for s in (22, 23, 22)], temperature=0.5
    ),
    "text only": lambda m: {"model": m, "messages": [{"role": "user", "content": "hello"}]},
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
}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_render_matches_upstream(servers, case):
    model, upstream, ours = servers
    body = CHAT_CASES[case](model)
    path = "/v1/chat/completions/render"
    theirs = decode_generate_request(post(upstream, path, body), WireFormat.JSON)
    mine = decode_generate_request(post(ours, path, body), WireFormat.JSON)
    assert_same_request(mine, theirs)


@pytest.mark.parametrize(
    "prompt", [[1, 2, 3, 4], [[5, 6], [7, 8, 9]], "the quick brown fox", ["a b", "c d e"]]
)
def test_completion_render_matches_upstream(servers, prompt):
    model, upstream, ours = servers
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "logprobs": 2}
    path = "/v1/completions/render"
    theirs = decode_generate_requests(post(upstream, path, body), WireFormat.JSON)
    mine = decode_generate_requests(post(ours, path, body), WireFormat.JSON)
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert_same_request(a, b)


def test_our_binary_answer_carries_the_same_items(servers):
    model, _, ours = servers
    body = chat_body(model, [data_url(png_bytes(seed=24))])
    path = "/v1/chat/completions/render"
    j = decode_generate_request(post(ours, path, body), WireFormat.JSON)
    r = httpx.post(
        ours + path, json=body, headers={"accept": "application/vnd.msgpack"}, timeout=60
    )
    m = decode_generate_request(r.content, WireFormat.MSGPACK)
    assert_same_request(m, j)
    assert len(r.content) < len(post(ours, path, body)) * 0.8  # no base64
