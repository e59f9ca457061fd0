"""Generate's two stream bodies over the same documents, without an engine: SSE as upstream
writes it, and the binary stream (``tandem_wire.streams``) for a caller that asks for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from tandem_generate.errors import EngineNotReady
from tandem_generate.serving import _frames, _sse_events
from tandem_wire import GenerateStreamChoice, GenerateStreamResponse, UsageInfo
from tandem_wire.streams import FrameReader, StreamFrameKind, decode_error

pytestmark = pytest.mark.anyio

DOCS: list[Any] = [
    {
        "request_id": "r1",
        "choices": [GenerateStreamChoice(index=0, token_ids=[5])],
        "output_mode": "tokens",
    },
    GenerateStreamResponse(request_id="r1", choices=[], usage=UsageInfo(1, 2, 1)),
]


class Source:
    """The service's documents, then ``fail`` (if any); records whether it was closed."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.closed = False

    async def chunks(self) -> AsyncIterator[Any]:
        try:
            for doc in DOCS:
                yield doc
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


async def _body(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([piece async for piece in stream])


async def test_the_sse_body_is_upstreams():
    source = Source()
    assert await _body(_sse_events(source.chunks())) == (
        b'data: {"request_id":"r1","choices":[{"index":0,"token_ids":[5],"logprobs":null,'
        b'"finish_reason":null,"stop_reason":null,"weight_versions":null}],'
        b'"output_mode":"tokens"}\n\n'
        b'data: {"request_id":"r1","choices":[],"usage":{"prompt_tokens":1,"total_tokens":2,'
        b'"completion_tokens":1,"prompt_tokens_details":null},"prompt_token_ids":null,'
        b'"mm_placeholders":null,"output_mode":"tokens"}\n\n'
        b"data: [DONE]\n\n"
    )
    assert source.closed


async def test_the_binary_body_carries_the_same_documents_then_its_end():
    raw = await _body(_frames(Source().chunks()))
    reader = FrameReader()
    frames = reader.feed(raw)
    reader.finish()
    assert [k for k, _ in frames] == [StreamFrameKind.EVENT] * 2 + [StreamFrameKind.END]
    sse = await _body(_sse_events(Source().chunks()))
    events = [msgspec.json.decode(e[6:]) for e in sse.split(b"\n\n")[:2]]
    assert [msgspec.msgpack.decode(p) for _, p in frames[:2]] == events


async def test_a_typed_error_mid_stream_ends_the_binary_stream_with_it():
    source = Source(EngineNotReady("the engine died; this node is restarting"))
    raw = await _body(_frames(source.chunks()))
    reader = FrameReader()
    frames = reader.feed(raw)
    reader.finish()  # ended whole: the error is its last frame
    assert [k for k, _ in frames] == [StreamFrameKind.EVENT] * 2 + [StreamFrameKind.ERROR]
    error = decode_error(frames[-1][1]).error
    assert (error.type, error.code) == (EngineNotReady.type, 503)
    assert error.message == "the engine died; this node is restarting"
    assert source.closed


async def test_a_bug_mid_stream_cuts_the_binary_stream_as_it_cuts_sse():
    for body in (_frames, _sse_events):
        with pytest.raises(RuntimeError):
            await _body(body(Source(RuntimeError("a bug")).chunks()))


async def test_a_reader_that_leaves_closes_the_documents():
    # The service's documents' own clean-up aborts the engine request.
    for body in (_frames, _sse_events):
        source = Source()
        stream = body(source.chunks())
        await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        assert source.closed
