"""Inline processing: the renderer's CPU steps run on the worker's event loop thread."""

from __future__ import annotations

import threading

import msgspec
import pytest
from vllm.multimodal.media import ImageMediaIO

from tandem_render.inline import InlineExecutor
from tandem_render.media import MediaLoader
from tandem_render.metrics import RenderMetrics
from tandem_render.service import RenderService
from tandem_render.settings import RenderSettings
from tandem_wire import WireFormat

from ...support.images import chat_body, data_url, png_bytes


def test_inline_executor_runs_at_once_and_keeps_errors() -> None:
    pool = InlineExecutor()
    calls: list[int] = []
    done = pool.submit(lambda x: calls.append(threading.get_ident()) or x * 2, 21)
    assert done.done() and done.result() == 42 and calls == [threading.get_ident()]
    failed = pool.submit(int, "not a number")
    assert failed.done() and isinstance(failed.exception(), ValueError)


@pytest.mark.anyio
@pytest.mark.vllm
async def test_chat_with_an_image_renders_on_the_loop_thread(
    qwen2_renderer, qwen2_dir, monkeypatch
) -> None:
    decoding_threads: list[int] = []
    original = ImageMediaIO.load_bytes

    def load_bytes(self, data):  # type: ignore[no-untyped-def]
        decoding_threads.append(threading.get_ident())
        return original(self, data)

    monkeypatch.setattr(ImageMediaIO, "load_bytes", load_bytes)
    from prometheus_client import CollectorRegistry

    settings = RenderSettings(model=qwen2_dir)
    assert settings.inline_processing  # the default, which the session renderer was built with
    service = RenderService(
        settings,
        qwen2_renderer,
        MediaLoader(settings.media_policy()),
        RenderMetrics.create(CollectorRegistry()),
    )
    body = msgspec.json.encode(chat_body(qwen2_dir, [data_url(png_bytes(seed=4242))]))
    result = await service.render_chat(body, WireFormat.JSON)
    assert len(result.features.mm_hashes["image"]) == 1
    assert decoding_threads == [threading.get_ident()]
