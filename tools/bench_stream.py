"""The door's CPU per streamed token: generate's stream read as SSE or as binary frames.

In-process and engine-free: the door's app over a crafted render node and a crafted generate
node whose stream (a chat of ``--tokens`` one-token events) is encoded before the clock starts,
so what is measured is the door reading generate's events and writing the caller's SSE through
``vllm serve``'s chat serving. Process CPU of one thread; modes interleaved round by round.
Reading alone (the door's reader over a recorded body, without vLLM's serving) is timed too.

    python -m tools.bench_stream [--rounds 9] [--tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem_front.app import create_app
from tandem_front.openai_service import _events, _frame_events
from tandem_front.settings import FrontSettings
from tandem_front.vllm_answers import VllmAnswers, _choices
from tandem_wire import GenerateRequest, WireFormat, encode_document, encode_generate_requests
from tandem_wire.streams import (
    END_FRAME,
    STREAM_CONTENT_TYPE,
    accepts_stream_frames,
    encode_event_frame,
)
from tools.tiny_models import ensure_model

MODES = (
    ("SSE, one event per read (before)", False, 1),
    ("binary, one frame per read", True, 1),
    ("SSE, 8 events per read", False, 8),
    ("binary, 8 frames per read (coalesced)", True, 8),
    ("binary, the whole stream in one read", True, 0),
)


def stream_docs(request_id: str, tokens: int, logprobs: bool) -> list[dict[str, Any]]:
    """Generate's stream documents: one token per event (top-5 logprobs when asked)."""
    docs = []
    for k in range(tokens):
        t = 300 + (k * 7) % 500
        choice: dict[str, Any] = {
            "index": 0,
            "token_ids": [t],
            "logprobs": None,
            "finish_reason": "length" if k == tokens - 1 else None,
            "stop_reason": None,
            "weight_versions": None,
        }
        if logprobs:
            top = [{"token_id": t + j, "logprob": -0.1 * (j + 1), "rank": j + 1} for j in range(5)]
            entry = {"token_id": t, "logprob": -0.1, "rank": 1, "top_logprobs": top}
            choice["logprobs"] = {"content": [entry]}
        docs.append({"request_id": request_id, "choices": [choice], "output_mode": "tokens"})
    return docs


def encoded(docs: list[dict[str, Any]], binary: bool) -> tuple[list[bytes], str]:
    """The stream's body as generate writes it, one piece per event, and its media type."""
    if binary:
        return [encode_event_frame(d) for d in docs] + [END_FRAME], STREAM_CONTENT_TYPE
    sse = [b"data: " + encode_document(d, WireFormat.JSON) + b"\n\n" for d in docs]
    return sse + [b"data: [DONE]\n\n"], "text/event-stream"


class _Body(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


class Nodes(httpx.AsyncBaseTransport):
    """Render answers a three-token prompt; generate streams ``stream_docs``, as frames when
    the door names them and ``binary`` is set, ``per_read`` events to a chunk (0: all)."""

    def __init__(self, tokens: int, logprobs: bool, binary: bool, per_read: int) -> None:
        self.tokens, self.logprobs, self.binary, self.per_read = tokens, logprobs, binary, per_read
        sampling = {"max_tokens": tokens, **({"logprobs": 5} if logprobs else {})}
        rendered = encode_generate_requests(
            [GenerateRequest(token_ids=[1, 2, 3], sampling_params=sampling)], WireFormat.MSGPACK
        )
        single = msgspec.msgpack.encode(msgspec.msgpack.decode(rendered)[0])

        async def render(request: Request) -> Response:
            return Response(single, media_type=WireFormat.MSGPACK.content_type)

        app = Starlette(routes=[Route("/v1/chat/completions/render", render, methods=["POST"])])
        self.render = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            return await self.render.handle_async_request(request)
        if request.method == "GET":  # the door's weight-version poll
            return httpx.Response(404)
        gen = msgspec.msgpack.decode(await request.aread())
        framed = self.binary and accepts_stream_frames(request.headers.get("accept"))
        pieces, media = encoded(stream_docs(gen["request_id"], self.tokens, self.logprobs), framed)
        n = self.per_read or len(pieces)
        chunks = [b"".join(pieces[i : i + n]) for i in range(0, len(pieces), n)]
        return httpx.Response(200, headers={"content-type": media}, stream=_Body(chunks))


async def door_us_per_token(
    answers: VllmAnswers, settings: FrontSettings, tokens: int, logprobs: bool, mode: Any
) -> tuple[float, int]:
    """One streamed chat through the door: its CPU per token (us) and the caller's chunks."""
    _, binary, per_read = mode
    app = create_app(settings, answers, Nodes(tokens, logprobs, binary, per_read))
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": tokens,
    }
    if logprobs:
        body.update(logprobs=True, top_logprobs=5)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://door") as c:
            await c.post("/v1/chat/completions", json=body)  # warm
            start = time.process_time()
            r = await c.post("/v1/chat/completions", json=body)
            cpu = time.process_time() - start
    if r.status_code != 200 or b'"error"' in r.content:
        raise RuntimeError(f"the door failed: {r.text[-300:]}")
    return cpu / tokens * 1e6, r.content.count(b"data: ")


async def read_us_per_token(tokens: int, logprobs: bool, binary: bool, rounds: int) -> list[float]:
    """The door's reader alone over a recorded body, one event per read."""
    reader: Callable[[httpx.Response], AsyncIterator[Any]] = _frame_events if binary else _events
    pieces, media = encoded(stream_docs("chatcmpl-" + "0" * 32, tokens, logprobs), binary)
    out = []
    for _ in range(rounds):
        response = httpx.Response(200, headers={"content-type": media}, stream=_Body(pieces))
        start = time.process_time()
        async for event in reader(response):
            _choices(event)
        out.append((time.process_time() - start) / tokens * 1e6)
    return out


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f})"


async def main(rounds: int, tokens: int) -> None:
    model = str(ensure_model("qwen2-vl"))
    settings = FrontSettings(render_urls=("http://r1",), generate_urls=("http://g1",), model=model)
    answers = VllmAnswers(settings)
    print("| logprobs | the door reads | us/token, median (min) |\n| --- | --- | --- |")
    for logprobs in (False, True):
        for binary in (False, True):
            read = await read_us_per_token(tokens, logprobs, binary, rounds * 5)
            name = "binary frames" if binary else "SSE"
            print(f"| {'top 5' if logprobs else 'none'} | {name} | {_cell(read)} |")
    results: dict[tuple[bool, str], list[tuple[float, int]]] = {}
    for _ in range(rounds):  # interleaved: every mode once per round
        for logprobs in (False, True):
            for mode in MODES:
                got = await door_us_per_token(answers, settings, tokens, logprobs, mode)
                results.setdefault((logprobs, mode[0]), []).append(got)
    print("\n| logprobs | generate's stream | door CPU us/token, median (min) | caller's chunks |")
    print("| --- | --- | --- | --- |")
    for (logprobs, name), runs in results.items():
        cell = _cell([us for us, _ in runs])
        print(f"| {'top 5' if logprobs else 'none'} | {name} | {cell} | {runs[0][1]} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.tokens))
