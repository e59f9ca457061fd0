"""Render writes ``max_tokens`` always, so a request for exactly vLLM's default still says so."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from tandem_render.media import MediaLoader
from tandem_render.metrics import RenderMetrics
from tandem_render.service import RenderService
from tandem_render.settings import RenderSettings
from tandem_wire import WireFormat

from ...support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


@pytest.fixture
def service(qwen2_renderer, qwen2_dir):
    settings = RenderSettings(model=qwen2_dir)
    return RenderService(
        settings,
        qwen2_renderer,
        MediaLoader(settings.media_policy()),
        RenderMetrics.create(CollectorRegistry()),
    )


@pytest.mark.parametrize("max_tokens", [16, 1, 17])
async def test_chat_render_writes_max_tokens(service, qwen2_dir, max_tokens):
    body = chat_body(qwen2_dir, [data_url(png_bytes())], max_tokens=max_tokens)
    out = await service.render_chat(msgspec.json.encode(body), WireFormat.JSON)
    assert out.sampling_params["max_tokens"] == max_tokens


async def test_a_chat_without_max_tokens_gets_the_room_left(service, qwen2_dir, qwen2_renderer):
    body = chat_body(qwen2_dir, [data_url(png_bytes())])
    out = await service.render_chat(msgspec.json.encode(body), WireFormat.JSON)
    max_len = qwen2_renderer.max_model_len
    assert out.sampling_params["max_tokens"] == max_len - len(out.token_ids)


async def test_a_completion_without_max_tokens_gets_16(service, qwen2_dir):
    body = {"model": qwen2_dir, "prompt": [1017, 359, 261]}
    (out,) = await service.render_completion(msgspec.json.encode(body), WireFormat.JSON)
    assert out.sampling_params["max_tokens"] == 16  # CompletionRequest's own default
