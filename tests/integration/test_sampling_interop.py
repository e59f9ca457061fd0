"""max_tokens across the pairs: ours writes what was asked; an absent one means what upstream
means by it (the room left in the context), on our generate as on upstream's."""

from __future__ import annotations

import json

import httpx
import pytest

from ..support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def render(url: str, body: dict) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions/render", json=body, timeout=120)
    assert r.status_code == 200, r.text[:1500]
    return r.json()


def completions(url: str, request: dict) -> list[list[int]]:
    r = httpx.post(
        f"{url}/inference/v1/generate",
        content=json.dumps(request).encode(),
        headers={"content-type": "application/json"},
        timeout=300,
    )
    assert r.status_code == 200, r.text[:1500]
    return [c["token_ids"] for c in r.json()["choices"]]


def test_our_render_output_gets_16_tokens_on_either_generate(fleet):
    model, urls = fleet
    body = chat_body(
        model, [data_url(png_bytes(seed=61))], max_tokens=16, temperature=0.0, ignore_eos=True
    )
    request = render(urls["render"], body)
    assert request["sampling_params"]["max_tokens"] == 16
    ours = completions(urls["generate"], request)
    upstream = completions(urls["up_serve"], request)
    assert [len(c) for c in ours] == [len(c) for c in upstream] == [16]
    assert ours == upstream


def test_upstream_render_output_means_the_same_on_our_generate(fleet):
    """Upstream's render drops max_tokens=16 (SamplingParams' default) and upstream's generate
    fills the context for an absent max_tokens: ours must read the document the same way. A
    long prompt keeps the room left (and so the test) short."""
    model, urls = fleet
    text = "alpha beta gamma delta " * 300
    body = chat_body(
        model,
        [data_url(png_bytes(seed=62))],
        text=text,
        max_tokens=16,
        temperature=0.0,
        ignore_eos=True,
    )
    request = render(urls["up_render"], body)
    assert "max_tokens" not in request["sampling_params"]
    room = 4096 - len(request["token_ids"])
    assert 16 < room < 400, room
    ours = completions(urls["generate"], request)
    upstream = completions(urls["up_serve"], request)
    assert [len(c) for c in ours] == [len(c) for c in upstream] == [room]
    assert ours == upstream
