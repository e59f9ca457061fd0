"""Generate admits by bytes held: concurrent large bodies past its byte budget are refused
429 with Retry-After before they are read, the admitted ones are answered as if alone, and
every byte comes back once they are answered (real CPU engine, a few short requests)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tandem_wire import WireFormat, encode_generate_request

from ...support.asgi import AsgiCall, app_client
from ...support.images import data_url, png_bytes
from .helpers import GREEDY, generate_app, render, tokens, with_sampling

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json", "accept": "application/json"}


PIXELS = 256 * 4 * 1176
"""A 448x448 image's pixel_values: 256 image tokens of 4 cells of 1176 bytes."""


async def short_and_streamed(renderer, model: str, seed: int) -> tuple[bytes, bytes]:
    """JSON bodies of one rendered 448x448 image: a short greedy request, and a long stream
    of the same that holds its place (and bytes) while the test runs."""
    req = await render(renderer, model, [data_url(png_bytes(448, 448, seed=seed))], **GREEDY)
    long = msgspec.structs.replace(with_sampling(req, max_tokens=400, ignore_eos=True), stream=True)
    return encode_generate_request(req, WireFormat.JSON), encode_generate_request(
        long, WireFormat.JSON
    )


async def started_stream(app, streamed: bytes) -> AsgiCall:
    """``streamed`` posted and its first chunk read: it holds its slot until it hangs up."""
    headers = {**JSON, "content-length": str(len(streamed))}
    stream = AsgiCall(app, "POST", "/inference/v1/generate", streamed, headers)
    assert await stream.status() == 200
    assert (await stream.chunk()).startswith(b"data: ")
    return stream


def held_bytes(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("tandem_generate_held_bytes "))
    return float(line.split()[1])


async def test_large_bodies_past_the_byte_budget_are_refused_and_the_rest_answered(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    req = await render(qwen2_renderer, qwen2_dir, [data_url(png_bytes(448, 448, seed=9))], **GREEDY)
    body = encode_generate_request(req, WireFormat.JSON)  # ~1.6 MB: base64 pixels
    # Room for two requests' bodies and one request's decoded pixels: with six sent at once,
    # two at most are admitted; the others are refused before their bodies are read.
    app = generate_app(qwen2_engine, qwen2_dir, max_held_bytes=2 * len(body) + PIXELS + 4096)
    async with app_client(app) as c:
        alone = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert alone.status_code == 200, alone.text[:500]
        expected = tokens(alone.json())
        answers = await asyncio.gather(
            *(c.post("/inference/v1/generate", content=body, headers=JSON) for _ in range(6))
        )
        statuses = sorted(r.status_code for r in answers)
        assert set(statuses) == {200, 429}, statuses
        for r in answers:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "overloaded"
            else:
                assert tokens(r.json()) == expected
        # Every byte came back: the gauge reads 0, and a request needing the room is taken.
        assert held_bytes((await c.get("/metrics")).text) == 0
        again = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert again.status_code == 200 and tokens(again.json()) == expected
        # A body larger than the whole budget could never be admitted: 413.
        huge = await c.post("/inference/v1/generate", content=body * 4, headers=JSON)
        assert (huge.status_code, huge.json()["error"]["type"]) == (413, "payload_too_large")


async def test_a_streaming_request_holds_its_body_and_decoded_pixels_until_it_ends(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    body, streamed = await short_and_streamed(qwen2_renderer, qwen2_dir, seed=11)
    # Two bodies fit, but not two bodies plus the pixels the first decoded.
    budget = len(streamed) + len(body) + PIXELS // 2
    app = generate_app(qwen2_engine, qwen2_dir, max_held_bytes=budget)
    async with app_client(app) as c:
        stream = await started_stream(app, streamed)
        refused = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
        await stream.hang_up()  # the client leaves mid-stream: the engine request is aborted
        assert held_bytes((await c.get("/metrics")).text) == 0
        answered = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert answered.status_code == 200


MSGPACK = {"content-type": "application/vnd.msgpack", "accept": "application/json"}
DEDUP = frozenset({"qwen_vl.temporal_dedup/v1"})


async def test_items_that_would_decode_past_the_room_left_are_refused_before_they_are(
    qwen2_engine, qwen2_renderer, qwen2_dir
):
    body, streamed = await short_and_streamed(qwen2_renderer, qwen2_dir, seed=12)
    # The stream holds its body and pixels; the next body fits beside them, its pixels do not.
    budget = len(streamed) + PIXELS + len(body) + PIXELS // 2
    app = generate_app(qwen2_engine, qwen2_dir, max_held_bytes=budget)
    async with app_client(app) as c:
        stream = await started_stream(app, streamed)
        held = held_bytes((await c.get("/metrics")).text)
        decoded = held - len(streamed)  # its item as base64 decodes it (pixels and framing)
        assert PIXELS <= decoded < PIXELS + 4096
        refused = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
        error = refused.json()["error"]
        assert error["type"] == "overloaded"
        # Refused on its pixels, with its body already held: the count it was refused on.
        assert error["details"]["wanted_bytes"] == decoded
        assert error["details"]["held_bytes"] == held + len(body)
        assert error["details"]["max_held_bytes"] == budget
        assert held_bytes((await c.get("/metrics")).text) == held  # its body given back
        await stream.hang_up()
        assert held_bytes((await c.get("/metrics")).text) == 0
        served = await c.post("/inference/v1/generate", content=body, headers=JSON)
        assert served.status_code == 200, served.text[:300]


@pytest.mark.parametrize("binary", [False, True], ids=["json-base64", "msgpack-rebuilt"])
async def test_items_that_would_decode_past_the_whole_budget_are_413(
    qwen2_engine, qwen2_renderer, qwen2_dir, binary
):
    image = [data_url(png_bytes(448, 448, seed=13))]
    if binary:  # one frame of each patch sent: generate rebuilds both (twice what was sent)
        req = await render(qwen2_renderer, qwen2_dir, image, transforms=DEDUP, **GREEDY)
        body, headers = encode_generate_request(req, WireFormat.MSGPACK), MSGPACK
    else:
        req = await render(qwen2_renderer, qwen2_dir, image, **GREEDY)
        body, headers = encode_generate_request(req, WireFormat.JSON), JSON
    # The body alone fits the budget; with what its items decode to, it never will.
    app = generate_app(qwen2_engine, qwen2_dir, max_held_bytes=len(body) + PIXELS // 2)
    async with app_client(app) as c:
        r = await c.post("/inference/v1/generate", content=body, headers=headers)
        assert (r.status_code, r.json()["error"]["type"]) == (413, "payload_too_large")
        assert held_bytes((await c.get("/metrics")).text) == 0
        text = msgspec.structs.replace(req, features=None, token_ids=[17, 11, 79])
        served = await c.post(
            "/inference/v1/generate",
            content=encode_generate_request(text, WireFormat.JSON),
            headers=JSON,
        )
        assert served.status_code == 200, served.text[:300]
