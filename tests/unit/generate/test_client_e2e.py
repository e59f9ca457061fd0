"""The client against the real render and generate apps (in-process, one shared engine)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
import pytest

from tandem_client import AsyncTandemClient
from tandem_render.app import create_app as create_render_app
from tandem_render.settings import RenderSettings

from ...support.images import png_bytes
from .helpers import generate_app

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022


class Router(httpx.AsyncBaseTransport):
    """Sends each request to the in-process app named by its host."""

    def __init__(self, apps: dict[str, object]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transports[request.url.host].handle_async_request(request)


@pytest.fixture
async def client(qwen2_engine, qwen2_renderer, qwen2_dir):
    render = create_render_app(
        RenderSettings(model=qwen2_dir, max_images_per_prompt=8), qwen2_renderer
    )
    generate = generate_app(qwen2_engine, qwen2_dir)
    async with AsyncExitStack() as stack:
        for app in (render, generate):
            await stack.enter_async_context(app.router.lifespan_context(app))
        transport = Router({"render": render, "generate": generate})
        c = AsyncTandemClient(
            "http://render", "http://generate", model=qwen2_dir, transport=transport
        )
        stack.push_async_callback(c.aclose)
        c.generate_app = generate  # type: ignore[attr-defined]
        yield c


def image_chat(seed: int) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": png_bytes(seed=seed)},
                {"type": "text", "text": "Describe."},
            ],
        }
    ]


async def test_chat_sends_each_image_once_and_recovers_from_a_lost_cache(client):
    first = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    again = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    assert again.choices[0].token_ids == first.choices[0].token_ids
    service = client.generate_app.state.service
    hits = service.metrics.item_cache_hits.collect()[0].samples[0].value
    assert hits >= 1  # the second request sent null and hit the node's cache
    service.items.clear()  # the node "restarts": the client's null gets a 409 and it resends
    third = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    assert third.choices[0].token_ids == first.choices[0].token_ids


async def test_rollout_with_token_id_prompts_and_several_images(client, qwen2_dir):
    prompts = [
        [
            1017,
            359,
            261,
            198,
            1019,
            IMAGE_PAD,
            1020,
            1019,
            IMAGE_PAD,
            1020,
            82,
            1018,
            198,
            1017,
            436,
            198,
        ],
        [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 88, 1018, 198, 1017, 436, 198],
    ]
    images = [[png_bytes(seed=42), png_bytes(seed=43)], [png_bytes(seed=44)]]
    result = await client.rollout(
        prompts,
        images,
        n=3,
        temperature=1.0,
        max_tokens=5,
        logprobs=2,
        seed=5,
        mm_processor_kwargs={"max_pixels": 224 * 224},
        progress=False,
    )
    assert len(result.prompt_ids) == 2 and len(result.completion_ids) == 6
    assert result.prompt_ids[0].count(IMAGE_PAD) == 2 * 64  # each image expanded in place
    assert result.prompt_ids[1][:5] == prompts[1][:5]  # never re-tokenized
    for completion, lps, ids in zip(
        result.completion_ids, result.logprobs, result.logprob_token_ids, strict=True
    ):
        assert len(completion) == len(lps) == len(ids) == 5
        assert [step[0] for step in ids] == completion  # sampled token first
        assert all(1 <= len(step) <= 3 for step in lps)
