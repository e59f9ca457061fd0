"""The door reads generate's stream in the binary framing (``tandem_wire.streams``) when the
node answers it, and SSE from a node that does not: the caller's SSE is the same text either
way, failures mid-stream reach the caller as the same error event, and events that arrive
together are coalesced without changing a token, a logprob or a finish reason."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from tandem_wire import WEIGHT_VERSIONS_HEADER, ErrorBody, ErrorInfo, WireFormat, encode_document
from tandem_wire.streams import (
    END_FRAME,
    STREAM_CONTENT_TYPE,
    accepts_stream_frames,
    encode_error_frame,
    encode_event_frame,
)

from .test_front_answers import CHAT, Pair, post
from .test_front_proxy_failures import _Stream, events

pytestmark = pytest.mark.anyio

Event = dict[str, Any]


def _entry(token_id: int, logprob: float, tops: list[tuple[int, float, int]]) -> dict[str, Any]:
    top = [{"token_id": i, "logprob": p, "rank": k} for i, p, k in tops]
    return {"token_id": token_id, "logprob": logprob, "rank": 1, "top_logprobs": top}


def _step(index: int, token: int, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One token of sample ``index`` as generate streams it (with logprobs: top 3)."""
    lp = _entry(token, -0.25, [(token, -0.25, 1), (token + 1, -1.5, 2), (token + 2, -3.0, 3)])
    return {
        "index": index,
        "token_ids": [token],
        "logprobs": {"content": [lp]},
        "finish_reason": finish,
        "stop_reason": None,
        "weight_versions": None,
        **extra,
    }


def _span(end: int) -> list[dict[str, Any]]:
    return [{"version": "v1", "start": 0, "end": end}]


def stream_events(request_id: str, tokens: int = 5) -> list[Event]:
    """Two samples, one token per event, sample 1 ending first; then the usage chunk. As
    generate writes them (each event with its request id and output mode)."""
    out: list[Event] = []
    for k in range(tokens):
        last = k == tokens - 1
        choices = [_step(0, 300 + k, "length" if last else None, **_ends(last, tokens))]
        if k < tokens - 1:
            early = k == tokens - 2
            choices.append(_step(1, 400 + k, "stop" if early else None, **_ends(early, k + 1)))
        out.append({"request_id": request_id, "choices": choices, "output_mode": "tokens"})
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 2 * tokens - 1,
        "total_tokens": 2 * tokens + 2,
    }
    out.append({"request_id": request_id, "choices": [], "usage": usage, "output_mode": "tokens"})
    return out


def _ends(last: bool, tokens: int) -> dict[str, Any]:
    return {"weight_versions": _span(tokens)} if last else {}


class Node(Pair):
    """Generate as this project's: the binary stream when the door names it, SSE otherwise
    (``binary=False``: a node that only speaks SSE, as upstream's). ``together``: every frame
    in one chunk, as a door that reads behind generate finds them. ``tail``: what ends the
    stream instead of its end (an error, or nothing)."""

    def __init__(
        self,
        *,
        binary: bool = True,
        together: bool = False,
        make: Any = stream_events,
        tail: Any = None,
    ) -> None:
        super().__init__(self._answer, {"max_tokens": 5, "n": 2, "logprobs": 2})
        self.binary = binary
        self.together = together
        self.make = make
        self.tail = tail
        self.accepts: list[str | None] = []
        self.framed: list[bool] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "r1" and request.method == "POST":
            self.accepts.append(request.headers.get("accept"))
        return await super().handle_async_request(request)

    def _answer(self, gen: dict[str, Any]) -> httpx.Response:
        framed = self.binary and accepts_stream_frames(self.accepts[-1])
        self.framed.append(framed)
        docs = self.make(gen["request_id"])
        if framed:
            pieces = [encode_event_frame(d) for d in docs]
            pieces.append(END_FRAME if self.tail is None else self._binary_tail())
            media = STREAM_CONTENT_TYPE
        else:
            pieces = [b"data: " + encode_document(d, WireFormat.JSON) + b"\n\n" for d in docs]
            pieces.append(b"data: [DONE]\n\n" if self.tail is None else self._sse_tail())
            media = "text/event-stream"
        if self.together:
            pieces = [b"".join(pieces)]

        async def body() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return httpx.Response(200, headers={"content-type": media}, stream=_Stream(body()))

    def _binary_tail(self) -> bytes:
        return encode_error_frame(self.tail) if isinstance(self.tail, ErrorBody) else self.tail

    def _sse_tail(self) -> bytes:
        if isinstance(self.tail, ErrorBody):
            return b"data: " + encode_document(self.tail, WireFormat.JSON) + b"\n\n"
        return b""  # cut: the body ends without [DONE]


def _same_call(text: bytes) -> bytes:
    """A caller's stream without what differs between two calls: its time, and the door's
    request id in an error event."""
    text = re.sub(rb'"created":\d+', b'"created":0', text)
    return re.sub(rb'"request_id":"[0-9a-f]{32}"', b'"request_id":"-"', text)


@pytest.fixture(autouse=True)
def _fixed_ids(monkeypatch):
    # The answer's id is random per call; fixed here so two calls can be compared byte for byte.
    monkeypatch.setattr("tandem_front.openai_service.new_request_id", lambda: "fixed")


ASK = {WEIGHT_VERSIONS_HEADER: "true"}
CASES = [
    (
        "/v1/chat/completions",
        {**CHAT, "n": 2, "logprobs": True, "top_logprobs": 2, "max_tokens": 5},
        None,
    ),
    ("/v1/chat/completions", {**CHAT, "n": 2, "max_tokens": 5}, ASK),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 2, "logprobs": 2, "max_tokens": 5}, None),
    ("/v1/messages", {**CHAT, "max_tokens": 5}, None),
]
IDS = ["chat-logprobs", "chat-weight-versions", "completions-two-prompts", "messages"]


async def _call(plain, node: Node, path: str, body: dict[str, Any], headers=None) -> bytes:
    body = {**body, "stream": True}
    if path != "/v1/messages":
        body["stream_options"] = {"include_usage": True}
    r = await post(plain, node, path, body, headers)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.parametrize(("path", "body", "headers"), CASES, ids=IDS)
async def test_the_caller_gets_the_same_sse_from_the_binary_stream_as_from_sse(
    plain, path, body, headers
):
    binary, sse = Node(binary=True), Node(binary=False)
    if path == "/v1/messages":  # one sample (Messages has no n)
        binary.make = sse.make = _one_sample
    got = await _call(plain, binary, path, body, headers)
    want = await _call(plain, sse, path, body, headers)
    assert all(binary.framed) and not any(sse.framed)
    assert _same_call(got) == _same_call(want)
    assert b"error" not in got and len(got) > 500  # a whole answer, not two equal failures


def _one_sample(request_id: str) -> list[Event]:
    docs = stream_events(request_id)
    for d in docs:
        d["choices"] = [c for c in d["choices"] if c["index"] == 0]
    return docs


async def test_the_door_asks_generate_for_the_binary_stream_only_when_it_streams(plain):
    node = Node()
    await _call(plain, node, *CASES[0][:2])
    assert accepts_stream_frames(node.accepts[-1])
    whole = Pair(
        lambda gen: httpx.Response(
            200, json={"request_id": gen["request_id"], "choices": [_step(0, 7, "length")]}
        )
    )
    seen: list[str | None] = []
    send = whole.handle_async_request

    async def spy(request: httpx.Request) -> httpx.Response:
        if request.url.host == "g1" and request.method == "POST":
            seen.append(request.headers.get("accept"))
        return await send(request)

    whole.handle_async_request = spy  # type: ignore[method-assign]
    r = await post(plain, whole, "/v1/chat/completions", {**CHAT, "max_tokens": 1})
    assert r.status_code == 200
    assert seen == [WireFormat.MSGPACK.content_type]  # a whole answer: msgpack, as before


# -- coalescing ------------------------------------------------------------------------------


def _content(chunks: list[Any]) -> dict[int, dict[str, Any]]:
    """Per answer choice: its text, its logprob tokens in order, its finish reason."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if chunk == "[DONE]":
            continue
        for c in chunk["choices"]:
            got = out.setdefault(c["index"], {"text": "", "logprobs": [], "finish": None})
            got["text"] += c["delta"].get("content") or ""
            got["logprobs"] += [e["token"] for e in (c.get("logprobs") or {}).get("content") or []]
            got["finish"] = c["finish_reason"] or got["finish"]
    return out


async def test_events_that_arrive_together_are_coalesced_into_the_same_answer(plain):
    path, body, _ = CASES[0]
    apart = events(await _call(plain, Node(), path, body))
    together = events(await _call(plain, Node(together=True), path, body))
    # Fewer chunks through vLLM's serving code...
    assert len(together) < len(apart)
    # ... the same text, logprobs in the same order, the same finish reasons and usage.
    assert _content(together) == _content(apart)
    assert {0, 1} == set(_content(apart))
    assert _content(apart)[1]["finish"] == "stop" and _content(apart)[0]["finish"] == "length"
    assert len(_content(apart)[0]["logprobs"]) == 5
    assert together[-2]["usage"] == apart[-2]["usage"]


# -- failures mid-stream ---------------------------------------------------------------------


async def test_an_error_mid_stream_reaches_the_caller_as_the_sse_error_does(plain):
    error = ErrorBody(ErrorInfo(type="unavailable", message="the engine died", code=503))
    path, body, _ = CASES[0]
    got = await _call(plain, Node(binary=True, tail=error), path, body)
    want = await _call(plain, Node(binary=False, tail=error), path, body)
    assert _same_call(got) == _same_call(want)
    chunks = events(got)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["error"]["type"] == "upstream_error"
    assert "the engine died" in chunks[-2]["error"]["message"]


@pytest.mark.parametrize(
    "tail",
    [b"\x07\x00\x00\x00\x00", b"\x01\x00\x00\x00\x09abc", b"\x01\x00\x00\x00\x02\xc1\xc1", b""],
    ids=["unknown-kind", "cut-inside-a-frame", "payload-not-msgpack", "no-end-frame"],
)
async def test_a_malformed_binary_stream_is_an_upstream_error_event(plain, tail):
    path, body, _ = CASES[0]
    chunks = events(await _call(plain, Node(tail=tail), path, body))
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["error"]["type"] == "upstream_error"
    assert chunks[-2]["error"]["code"] == 502
    assert "unreadable stream event" in chunks[-2]["error"]["message"]
    assert any("choices" in c for c in chunks[:-2])  # what came before it was sent


def test_frames_are_the_events_sse_carries():
    # The fixture above writes both streams from the same documents; the binary one must
    # decode to exactly those (otherwise the comparison above would prove nothing).
    for doc in stream_events("r"):
        frame = encode_event_frame(doc)
        assert msgspec.msgpack.decode(frame[5:]) == msgspec.json.decode(
            encode_document(doc, WireFormat.JSON)
        )


# -- the Responses API reads the same stream -------------------------------------------------


def _with_cached_usage(request_id: str) -> list[Event]:
    docs = _one_sample(request_id)
    docs[-1]["usage"]["prompt_tokens_details"] = {"cached_tokens": 32}
    return docs


async def test_a_streamed_response_reads_the_binary_stream_as_it_read_sse(plain):
    from .test_front_answers import sse
    from .test_front_responses import call

    got = {}
    for binary in (True, False):
        node = Node(binary=binary, make=_with_cached_usage)
        body = {"input": "hi", "stream": True, "max_output_tokens": 5}
        (r,) = await call(plain, node, ("POST", "/v1/responses", body))
        assert r.status_code == 200, r.text
        assert node.framed == [binary]
        sent = sse(r.content)
        kinds = [k for k, _ in sent]
        deltas = "".join(d["delta"] for k, d in sent if k == "response.output_text.delta")
        got[binary] = (kinds, deltas, sent[-1][1]["response"]["usage"])
    assert got[True] == got[False]
    kinds, deltas, usage = got[True]
    assert kinds[-1] == "response.completed" and len(deltas) > 0
    assert usage["input_tokens_details"]["cached_tokens"] == 32  # from the usage frame
