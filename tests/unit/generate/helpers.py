"""Shared steps of the generate tests: render a chat in-process, post it, read the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace

import msgspec

from tandem_client import AsyncTandemClient
from tandem_generate.app import create_app
from tandem_generate.settings import GenerateSettings
from tandem_render.app import create_app as create_render_app
from tandem_render.media import MediaLoader
from tandem_render.metrics import RenderMetrics
from tandem_render.service import RenderService
from tandem_render.settings import RenderSettings
from tandem_wire import (
    GenerateRequest,
    WireFormat,
    decode_document,
    encode_generate_request,
)

from ...support.asgi import HostRouter
from ...support.images import chat_body, data_url, png_bytes

MSGPACK = "application/vnd.msgpack"
GREEDY = {"temperature": 0.0, "max_tokens": 8}


def cpu_engine(model: str, **overrides):
    """Our Engine over vLLM's CPU build with the tests' settings (eager, a 4k context, seed 0,
    logprobs up to 8); ``overrides``: more AsyncEngineArgs."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tandem_generate.engine import Engine

    args = {
        "model": model,
        "enforce_eager": True,
        "max_model_len": 4096,
        "max_num_seqs": 4,
        "max_logprobs": 8,
        "seed": 0,
    }
    return Engine(AsyncEngineArgs(**{**args, **overrides}))


def generate_app(engine, model: str, *, render_transport=None, **overrides):
    """``render_transport``: how the content-parts render node is reached (an in-process
    one for tests, with ``content_parts_render_url`` naming its host)."""
    # No pre-faulting per app (tests/unit/http/test_memory.py covers it).
    base = GenerateSettings(served_model_names=(model,), pretouch_item_cache=False)
    settings = replace(base, **overrides)
    return create_app(
        settings, lambda: engine, shutdown_engine=False, render_transport=render_transport
    )


async def render(
    renderer, model: str, images: list, *, transforms: frozenset[str] = frozenset(), **sampling
) -> GenerateRequest:
    """What our render service answers for a chat with these images (in-process), in the wire
    ``transforms`` named (as a binary answer would be)."""
    from prometheus_client import CollectorRegistry

    rs = RenderSettings(model=model, max_images_per_prompt=8)
    service = RenderService(
        rs, renderer, MediaLoader(rs.media_policy()), RenderMetrics.create(CollectorRegistry())
    )
    urls = [data_url(png_bytes(seed=i)) if isinstance(i, int) else i for i in images]
    body = msgspec.json.encode(chat_body(model, urls, **sampling))
    return await service.render_chat(body, WireFormat.JSON, transforms)


async def render_body(
    renderer, model: str, body: dict, *, transforms: frozenset[str] = frozenset(), **settings
) -> GenerateRequest:
    """What our render service answers for any chat ``body`` (in-process), its wire
    ``transforms`` applied as a binary answer would have them."""
    from prometheus_client import CollectorRegistry

    rs = replace(RenderSettings(model=model, pretouch_cache_memory=False), **settings)
    service = RenderService(
        rs, renderer, MediaLoader(rs.media_policy()), RenderMetrics.create(CollectorRegistry())
    )
    return await service.render_chat(msgspec.json.encode(body), WireFormat.JSON, transforms)


def with_sampling(req: GenerateRequest, **fields) -> GenerateRequest:
    return msgspec.structs.replace(req, sampling_params={**req.sampling_params, **fields})


async def post(client, req: GenerateRequest, *, binary: bool = False, expect: int = 200):
    fmt = WireFormat.MSGPACK if binary else WireFormat.JSON
    headers = {"content-type": fmt.content_type, "accept": fmt.content_type}
    r = await client.post(
        "/inference/v1/generate", content=encode_generate_request(req, fmt), headers=headers
    )
    assert r.status_code == expect, r.text[:1000]
    return decode_document(r.content, dict, fmt) if r.status_code == 200 else r.json()


def tokens(answer: dict, index: int = 0) -> list[int]:
    return answer["choices"][index]["token_ids"]


__all__ = [
    "GREEDY",
    "client_stack",
    "MSGPACK",
    "generate_app",
    "post",
    "render",
    "render_body",
    "tokens",
    "with_sampling",
    "png_bytes",
    "data_url",
]


@asynccontextmanager
async def client_stack(
    engine, renderer, model: str, weight_dir: str | None = None, **generate_settings
) -> AsyncIterator[AsyncTandemClient]:
    """A client talking to the real render and generate apps in-process (hosts ``render`` and
    ``generate``), their lifespans running; ``weight_dir`` is the client's and the generate
    app's weight-transfer folder."""
    render_app = create_render_app(RenderSettings(model=model, max_images_per_prompt=8), renderer)
    if weight_dir is not None:
        generate_settings["weight_transfer_dir"] = weight_dir
    apps = {"render": render_app, "generate": generate_app(engine, model, **generate_settings)}
    async with AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        client = AsyncTandemClient(
            "http://render",
            "http://generate",
            model=model,
            weight_dir=weight_dir,
            transport=HostRouter(apps),
        )
        stack.push_async_callback(client.aclose)
        yield client
