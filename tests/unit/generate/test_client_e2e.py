"""The client against the real render and generate apps (in-process, one shared engine)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import pytest

from tandem_client import AsyncTandemClient
from tandem_render.app import create_app as create_render_app
from tandem_render.settings import RenderSettings
from tandem_wire import (
    ErrorBody,
    body_coding,
    decode_body,
    decode_document,
    decode_generate_request,
    format_of_content_type,
)

from ...support.images import png_bytes
from .helpers import generate_app

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
GENERATE = "/inference/v1/generate"


@dataclass(frozen=True)
class Exchange:
    """One request as it went over the transport, and the status it was answered with."""

    path: str
    body: bytes
    content_type: str
    status: int
    error_type: str | None
    content_encoding: str | None = None
    answer_encoding: str | None = None

    def decoded(self) -> bytes:
        return decode_body(self.body, body_coding(self.content_encoding), 1 << 30)

    def kwargs_data(self) -> dict[str, list[bytes | None]]:
        req = decode_generate_request(self.decoded(), format_of_content_type(self.content_type))
        assert req.features is not None and req.features.kwargs_data is not None
        return {
            m: [None if d is None else bytes(d) for d in v]
            for m, v in req.features.kwargs_data.items()
        }


class Router(httpx.AsyncBaseTransport):
    """Sends each request to the in-process app named by its host, and records what the client
    actually sent (body bytes) and what each app answered (status, error type)."""

    def __init__(self) -> None:
        self.transports: dict[str, httpx.AsyncBaseTransport] = {}
        self.exchanges: list[Exchange] = []

    def sent_to(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == path]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        response = await self.transports[request.url.host].handle_async_request(request)
        error_type = None
        if response.status_code >= 400:
            await response.aread()  # kept on the response: the client reads the same bytes
            fmt = format_of_content_type(response.headers.get("content-type"))
            error_type = decode_document(response.content, ErrorBody, fmt).error.type
        self.exchanges.append(
            Exchange(
                request.url.path,
                body,
                request.headers.get("content-type", ""),
                response.status_code,
                error_type,
                request.headers.get("content-encoding"),
                response.headers.get("content-encoding"),
            )
        )
        return response


@dataclass
class Stack:
    client: AsyncTandemClient
    router: Router
    restart_generate: Callable[[], Awaitable[None]]
    """Replace the generate node by a fresh app on the same engine: it holds no items."""


@pytest.fixture
async def stack(qwen2_engine, qwen2_renderer, qwen2_dir):
    async with AsyncExitStack() as exits:

        async def started(app):
            await exits.enter_async_context(app.router.lifespan_context(app))
            return httpx.ASGITransport(app=app)

        render = create_render_app(
            RenderSettings(model=qwen2_dir, max_images_per_prompt=8), qwen2_renderer
        )
        router = Router()
        router.transports["render"] = await started(render)
        router.transports["generate"] = await started(generate_app(qwen2_engine, qwen2_dir))

        async def restart_generate() -> None:
            router.transports["generate"] = await started(generate_app(qwen2_engine, qwen2_dir))

        c = AsyncTandemClient("http://render", "http://generate", model=qwen2_dir, transport=router)
        exits.push_async_callback(c.aclose)
        yield Stack(c, router, restart_generate)


@pytest.fixture
def client(stack):
    return stack.client


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


async def test_chat_sends_each_image_once_and_recovers_from_a_lost_cache(stack):
    client, router = stack.client, stack.router
    first = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    again = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    assert again.choices[0].token_ids == first.choices[0].token_ids
    full, held = router.sent_to(GENERATE)
    assert (full.status, held.status) == (200, 200)
    (item,) = full.kwargs_data()["image"]
    assert item is not None and len(item) > 10_000  # the first request carried the tensors
    # The second carried a null for the item, and bytes for nothing else of it.
    assert held.kwargs_data() == {"image": [None]}
    assert len(held.body) < len(full.body) - len(item)

    await stack.restart_generate()  # the node forgets its items: the client's null gets a 409
    del router.exchanges[:]
    third = await client.chat(image_chat(41), temperature=0.0, max_tokens=6)
    missed, resent = router.sent_to(GENERATE)
    assert (missed.status, missed.error_type) == (409, "mm_cache_miss")
    assert missed.kwargs_data() == {"image": [None]}
    assert resent.status == 200 and resent.kwargs_data() == {"image": [item]}
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


async def test_zstd_both_ways_gives_the_same_tokens_from_fewer_bytes(stack, qwen2_dir):
    router = stack.router
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": png_bytes(448, 448, seed=7, noise=False)},
                {"type": "text", "text": "Describe."},
            ],
        }
    ]
    plain = await stack.client.chat(chat, temperature=0.0, max_tokens=6)
    del router.exchanges[:]
    async with AsyncTandemClient(
        "http://render", "http://generate", model=qwen2_dir, transport=router, compression="zstd"
    ) as zc:
        packed = await zc.chat(chat, temperature=0.0, max_tokens=6)
    assert packed.choices[0].token_ids == plain.choices[0].token_ids
    (rendered,) = router.sent_to("/v1/chat/completions/render")
    assert rendered.answer_encoding == "zstd"  # render compressed its binary answer
    (sent,) = router.sent_to(GENERATE)
    assert sent.status == 200 and sent.content_encoding == "zstd"
    (item,) = sent.kwargs_data()["image"]
    assert item is not None and len(sent.body) < len(item) // 10  # a flat image: tiny frame
