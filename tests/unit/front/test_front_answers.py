"""The door's OpenAI answers, written by vLLM's own code (the tiny model's tokenizer) over crafted
render and generate answers: tool calls and reasoning through the parsers, echo, completions'
k + 1 logprob candidates, prompt logprobs, stop strings, when a stream's first chunk goes,
generate's weight versions on each choice for a caller that asks, and the Messages API
(``/v1/messages``, ``/v1/messages/count_tokens``: vLLM's Messages serving turns the body into a
chat request for render and the chat answer into a Messages answer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tandem_front.app import create_app
from tandem_front.settings import FrontSettings
from tandem_wire import WEIGHT_VERSIONS_HEADER, GenerateRequest
from tests.support.asgi import AsgiCall, app_client

from .conftest import door_settings
from .test_front_proxy_failures import _rendered, _Stream, events

pytestmark = pytest.mark.anyio

GENERATE = "/inference/v1/generate"
PROMPT = [1, 2, 3]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
Answer = Callable[[dict[str, Any]], httpx.Response]


def _settings(model_dir: str, **kw: Any) -> FrontSettings:
    return door_settings(model_dir, **kw)


class Pair(httpx.AsyncBaseTransport):
    """Render answers ``PROMPT`` with ``sampling``; generate answers what ``answer`` makes of
    each request it gets (recorded)."""

    def __init__(self, answer: Answer, sampling: dict[str, Any] | None = None) -> None:
        self.answer = answer
        self.generated: list[dict[str, Any]] = []
        sampling = sampling or {"max_tokens": 8}

        async def render(request: Request) -> Response:
            body = json.loads(await request.body())
            prompts = body.get("prompt")
            count = len(prompts) if isinstance(prompts, list) else 1
            reqs = [GenerateRequest(token_ids=PROMPT, sampling_params=sampling)] * count
            return _rendered(reqs, single=request.url.path.startswith("/v1/chat"))

        paths = ("/v1/chat/completions/render", "/v1/completions/render")
        app = Starlette(routes=[Route(p, render, methods=["POST"]) for p in paths])
        self.render = httpx.ASGITransport(app=app)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            return await self.render.handle_async_request(request)
        if request.method == "GET":  # the door's weight-version poll
            return httpx.Response(404)
        gen = msgspec.msgpack.decode(await request.aread())
        self.generated.append(gen)
        return self.answer(gen)


def whole(*choices: dict[str, Any], **fields: Any) -> Answer:
    def answer(gen: dict[str, Any]) -> httpx.Response:
        return httpx.Response(
            200, json={"request_id": gen["request_id"], "choices": list(choices), **fields}
        )

    return answer


def streamed(*chunks: list[dict[str, Any]]) -> Answer:
    """One generate event per item (its choices)."""

    async def source() -> AsyncIterator[bytes]:
        for choices in chunks:
            yield b"data: " + json.dumps({"choices": choices}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def answer(gen: dict[str, Any]) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Stream(source()))

    return answer


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def ended(tokenizer, text: str) -> list[int]:
    """``text``'s tokens and the end-of-sequence token the engine stopped on."""
    return [*ids(tokenizer, text), tokenizer.eos_token_id]


async def post(
    answers, transport: Pair, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    app = create_app(_settings("m"), answers, transport)
    async with app_client(app) as c:
        return await c.post(path, json={"model": "m", **body}, headers=headers)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


# -- tools and reasoning through vLLM's parsers ----------------------------------------------


async def test_tool_call_markup_is_answered_as_tool_calls(parsed, tokenizer):
    text = '</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t = Pair(whole({"index": 0, "token_ids": ended(tokenizer, text), "finish_reason": "stop"}))
    r = await post(parsed, t, "/v1/chat/completions", {**CHAT, "tools": TOOLS})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    # Before, the markup came back as content, with no tool_calls.
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "tool_calls"
    assert not choice["message"]["content"]


async def test_reasoning_markup_is_answered_as_reasoning(parsed, tokenizer):
    t = Pair(
        whole(
            {"index": 0, "token_ids": ended(tokenizer, "hmm</think>yes"), "finish_reason": "stop"}
        )
    )
    r = await post(parsed, t, "/v1/chat/completions", CHAT)
    message = r.json()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("hmm", "yes")


async def test_a_streamed_tool_call_is_streamed_as_tool_calls(parsed, tokenizer):
    text = '</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    tokens = ended(tokenizer, text)
    chunks = [[{"index": 0, "token_ids": [t]}] for t in tokens[:-1]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    t = Pair(streamed(*chunks))
    r = await post(parsed, t, "/v1/chat/completions", {**CHAT, "tools": TOOLS, "stream": True})
    sent = events(r.content)
    assert sent[-1] == "[DONE]"
    deltas = [c["choices"][0] for c in sent[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    calls = [tc for d in deltas for tc in d["delta"].get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    args = "".join(tc["function"].get("arguments") or "" for tc in calls)
    assert json.loads(args) == {"city": "Paris"}
    assert deltas[-1]["finish_reason"] == "tool_calls"


# -- echo and logprobs -----------------------------------------------------------------------


async def test_echo_with_max_tokens_0_answers_the_prompt_and_its_logprobs(plain, tokenizer):
    prompt_logprobs = [
        None,
        {"2": {"logprob": -1.5, "rank": 4}, "9": {"logprob": -0.1, "rank": 1}},
        {"3": {"logprob": -0.2, "rank": 1}},
    ]
    t = Pair(
        whole(
            {"index": 0, "token_ids": [7], "finish_reason": "length"},
            prompt_logprobs=prompt_logprobs,
        ),
        {"max_tokens": 1, "prompt_logprobs": 1, "logprobs": 1},
    )
    body = {"prompt": "abc", "echo": True, "max_tokens": 0, "logprobs": 1}
    r = await post(plain, t, "/v1/completions", body)
    assert r.status_code == 200, r.text  # before: 400, echo refused
    choice = r.json()["choices"][0]
    assert choice["text"] == "abc"  # the prompt alone: lm-eval's log-likelihood request
    lp = choice["logprobs"]
    assert lp["tokens"] == tokenizer.convert_ids_to_tokens(PROMPT)
    assert lp["token_logprobs"] == [None, -1.5, -0.2]
    assert lp["top_logprobs"][0] is None
    assert set(lp["top_logprobs"][1].values()) == {-1.5, -0.1}


def _entry(token_id: int, logprob: float, rank: int, tops: list[tuple[int, float, int]]) -> dict:
    top = [{"token_id": i, "logprob": p, "rank": k} for i, p, k in tops]
    return {"token_id": token_id, "logprob": logprob, "rank": rank, "top_logprobs": top}


async def test_completions_logprobs_k_lists_the_sampled_token_besides_the_top_k(plain):
    # logprobs=2 is asked of generate as 3: engine order, the sampled token first.
    outside = _entry(50, -4.0, 5, [(50, -4.0, 5), (60, -0.5, 1), (61, -1.0, 2)])
    inside = _entry(70, -0.3, 1, [(70, -0.3, 1), (71, -1.1, 2), (72, -2.0, 3)])
    lp = {"content": [outside, inside]}
    t = Pair(
        whole({"index": 0, "token_ids": [50, 70], "logprobs": lp, "finish_reason": "length"}),
        {"max_tokens": 2, "logprobs": 2},
    )
    r = await post(plain, t, "/v1/completions", {"prompt": "abc", "max_tokens": 2, "logprobs": 2})
    assert t.generated[0]["sampling_params"]["logprobs"] == 3
    tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
    # vLLM's completions: k + 1 candidates when the sampled token is not in the top k (before:
    # k), and the top k alone when it is (rank 3 left out).
    assert sorted(tops[0].values()) == [-4.0, -1.0, -0.5]
    assert sorted(tops[1].values()) == [-1.1, -0.3]


async def test_chat_answers_carry_prompt_logprobs(plain):
    prompt_logprobs = [None, {"2": {"logprob": -1.5, "rank": 4}}, {"3": {"logprob": -0.2}}]
    t = Pair(
        whole(
            {"index": 0, "token_ids": [7], "finish_reason": "length"},
            prompt_logprobs=prompt_logprobs,
        ),
        {"max_tokens": 1, "prompt_logprobs": 0},
    )
    r = await post(plain, t, "/v1/chat/completions", {**CHAT, "prompt_logprobs": 0})
    got = r.json()["prompt_logprobs"]
    assert got[0] is None
    assert got[1]["2"]["logprob"] == -1.5 and got[2]["3"]["logprob"] == -0.2


async def test_a_stop_string_cuts_the_text_as_vllm_does(plain, tokenizer):
    tokens = ids(tokenizer, "hello world")
    # As the engine answers: its tokens up to the one that completed the stop string.
    tokens = next(
        tokens[:n] for n in range(1, len(tokens) + 1) if "wor" in tokenizer.decode(tokens[:n])
    )
    choice = {"index": 0, "token_ids": tokens, "finish_reason": "stop", "stop_reason": "wor"}
    t = Pair(whole(choice), {"max_tokens": 8, "stop": ["wor"]})
    r = await post(plain, t, "/v1/completions", {"prompt": "abc", "stop": ["wor"]})
    # Before the door cut it, the text ran on to the end of the stop string's token.
    assert r.json()["choices"][0]["text"] == "hello "


# -- when a stream's first chunk goes, and failures ------------------------------------------


class Held(Pair):
    """Generate's stream holds its first tokens until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(self._answer, {"max_tokens": 4, "n": 2})
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    def _answer(self, gen: dict[str, Any]) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Stream(self._tokens()))

    async def _tokens(self) -> AsyncIterator[bytes]:
        self.reading.set()
        await self.release.wait()
        choices = [{"index": i, "token_ids": [75 + i], "finish_reason": "length"} for i in (0, 1)]
        yield b"data: " + json.dumps({"choices": choices}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


async def test_a_streamed_chat_sends_its_role_with_the_first_token_not_before(plain, tokenizer):
    t = Held()
    app = create_app(_settings("m"), plain, t)
    async with app_client(app):
        raw = json.dumps({"model": "m", **CHAT, "n": 2, "stream": True}).encode()
        call = AsgiCall(
            app, "POST", "/v1/chat/completions", raw, {"content-type": "application/json"}
        )
        assert await call.status() == 200  # headers early, as vllm serve's StreamingResponse
        await asyncio.wait_for(t.reading.wait(), 10)
        await asyncio.sleep(0.5)  # ample time to send anything the door would
        # Before, the role chunks were already out here, well ahead of any token.
        assert call.messages.empty()
        t.release.set()
        await asyncio.wait_for(call.task, 10)
        sent = b""
        while not call.messages.empty():
            sent += call.messages.get_nowait().get("body", b"")
    chunks = events(sent)
    deltas = [(ch["choices"][0]["index"], ch["choices"][0]["delta"]) for ch in chunks[:-1]]
    # vLLM's order: every choice's role, then the tokens of the output that brought them.
    assert deltas == [
        (0, {"role": "assistant", "content": ""}),
        (1, {"role": "assistant", "content": ""}),
        (0, {"content": tokenizer.decode([75])}),
        (1, {"content": tokenizer.decode([76])}),
    ]
    assert chunks[-1] == "[DONE]"


async def test_an_unreadable_render_answer_is_a_502(plain):
    class Garbled(Pair):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.host == "r1":
                headers = {"content-type": "application/vnd.msgpack"}
                return httpx.Response(200, headers=headers, content=b"\xc1\xc1")
            return await super().handle_async_request(request)

    t = Garbled(whole())
    r = await post(plain, t, "/v1/chat/completions", CHAT)
    # Before: 400, as if the caller had sent it.
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "upstream_error"
    assert t.generated == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "a", "stream": True, "stream_options": 5}),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": "x"}),
    ],
    ids=["stream-options", "top"],
)
async def test_a_body_vllm_refuses_is_a_400_before_render(plain, path, body):
    t = Pair(whole())
    r = await post(plain, t, path, body)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request"
    assert t.generated == []


# -- weight versions on each choice, for a caller that asks ----------------------------------

ASK = {WEIGHT_VERSIONS_HEADER: "true"}
TWO = {"max_tokens": 2, "n": 2}
ROUTES = [
    ("/v1/chat/completions", {**CHAT, "n": 2}),
    ("/v1/completions", {"prompt": ["a", "b"], "n": 2}),  # two prompts: answer choices 0..3
]


def versions(p: int, i: int) -> list[dict[str, Any]]:
    """Generate's spans of prompt ``p``'s choice ``i``: choice 1 was sampled across an update."""
    if i == 0:
        return [{"version": f"p{p}-old", "start": 0, "end": 2}]
    return [
        {"version": f"p{p}-old", "start": 0, "end": 1},
        {"version": f"p{p}-new", "start": 1, "end": 2},
    ]


def answer_versions(k: int) -> list[dict[str, Any]]:
    """What the door's answer choice ``k`` must carry: vLLM numbers prompt p's n = 2 choices
    from 2p (a chat has one prompt)."""
    return versions(k // 2, k % 2)


def _prompt(gen: dict[str, Any]) -> int:
    rid = gen["request_id"]  # completions: cmpl-<id>-<prompt>; chat: chatcmpl-<id>
    return int(rid.rsplit("-", 1)[1]) if rid.startswith("cmpl-") else 0


def whole_with_versions(gen: dict[str, Any]) -> httpx.Response:
    p = _prompt(gen)
    choices = [_last(i, [75 + i, 77], versions(p, i)) for i in (0, 1)]
    return whole(*choices)(gen)


def _last(index: int, tokens: list[int], spans: list[dict[str, Any]]) -> dict[str, Any]:
    """A choice's last (or only) output from generate: its spans ride on it."""
    return {
        "index": index,
        "token_ids": tokens,
        "finish_reason": "length",
        "weight_versions": spans,
    }


def streamed_with_versions(gen: dict[str, Any]) -> httpx.Response:
    """Choice 1 ends before choice 0; as generate's, the spans ride on each choice's last
    event only, and its last tokens with them."""
    p = _prompt(gen)
    return streamed(
        [{"index": 0, "token_ids": [75]}, {"index": 1, "token_ids": [76]}],
        [_last(1, [77], versions(p, 1))],
        [_last(0, [78], versions(p, 0))],
    )(gen)


def _without(document: dict[str, Any]) -> dict[str, Any]:
    """An answer or chunk without what differs between two calls (its id, its time) and
    without ``weight_versions``."""
    out = {k: v for k, v in document.items() if k not in ("id", "created")}
    out["choices"] = [
        {k: v for k, v in c.items() if k != "weight_versions"} for c in document["choices"]
    ]
    return out


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
async def test_a_whole_answer_carries_each_choices_spans_when_asked(plain, path, body):
    asked = await post(plain, Pair(whole_with_versions, TWO), path, body, ASK)
    assert asked.status_code == 200, asked.text
    choices = asked.json()["choices"]
    assert len(choices) == (2 if path.startswith("/v1/chat") else 4)
    for choice in choices:
        assert choice["weight_versions"] == answer_versions(choice["index"])
    # Not asked: vllm serve's answer, the same but for the field, which no choice has.
    plain_answer = (await post(plain, Pair(whole_with_versions, TWO), path, body)).json()
    assert all("weight_versions" not in c for c in plain_answer["choices"])
    assert _without(plain_answer) == _without(asked.json())


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=["chat", "completions"])
async def test_a_stream_carries_each_choices_spans_on_the_chunk_that_finishes_it(plain, path, body):
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    asked = await post(plain, Pair(streamed_with_versions, TWO), path, body, ASK)
    assert asked.status_code == 200, asked.text
    chunks = events(asked.content)
    assert chunks[-1] == "[DONE]"
    finished = []
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            if choice.get("finish_reason") is None:
                assert "weight_versions" not in choice  # only on the finishing chunk
            else:
                assert choice["weight_versions"] == answer_versions(choice["index"])
                finished.append(choice["index"])
    assert sorted(finished) == list(range(2 if path.startswith("/v1/chat") else 4))
    assert chunks[-2]["choices"] == [] and "usage" in chunks[-2]  # the usage chunk, untouched
    # Not asked: the same chunks, none with the field.
    plain_stream = await post(plain, Pair(streamed_with_versions, TWO), path, body)
    plain_chunks = events(plain_stream.content)
    assert b"weight_versions" not in plain_stream.content
    assert [_without(c) for c in plain_chunks[:-1]] == [_without(c) for c in chunks[:-1]]


async def test_a_choice_generate_gave_no_spans_for_answers_null_when_asked(plain):
    t = Pair(whole({"index": 0, "token_ids": [75], "finish_reason": "length"}))
    r = await post(plain, t, "/v1/chat/completions", CHAT, {WEIGHT_VERSIONS_HEADER: "TRUE"})
    assert r.json()["choices"][0]["weight_versions"] is None


async def test_a_choice_aborted_before_its_first_token_has_its_spans_only_in_a_whole_answer(
    plain,
):
    aborted = {"index": 1, "token_ids": [], "finish_reason": "abort", "weight_versions": []}
    r = await post(
        plain, Pair(whole(_last(0, [75], versions(0, 0)), aborted), TWO), *ROUTES[0], ASK
    )
    assert [c["weight_versions"] for c in r.json()["choices"]] == [versions(0, 0), []]
    # As vllm serve: no chunk for a choice with no output, so none to carry its (empty) spans.
    body = {**ROUTES[0][1], "stream": True}
    stream = streamed(
        [{"index": 0, "token_ids": [75]}], [aborted], [_last(0, [78], versions(0, 0))]
    )
    chunks = events((await post(plain, Pair(stream, TWO), ROUTES[0][0], body, ASK)).content)
    ending = [c for ch in chunks[:-1] for c in ch["choices"] if c.get("finish_reason")]
    assert [(c["index"], c["weight_versions"]) for c in ending] == [(0, versions(0, 0))]


@pytest.mark.parametrize("value", ["false", "1", ""])
async def test_only_true_asks_for_spans(plain, value):
    r = await post(
        plain, Pair(whole_with_versions, TWO), *ROUTES[0], {WEIGHT_VERSIONS_HEADER: value}
    )
    assert all("weight_versions" not in c for c in r.json()["choices"])


async def test_the_openai_sdk_reads_each_choices_spans(plain):
    """The released SDK keeps a field it does not know: ``model_extra`` and attribute access,
    whole and streamed."""
    import openai

    app = create_app(_settings("m"), plain, Pair(whole_with_versions, TWO))
    async with app_client(app) as c:
        sdk = openai.AsyncOpenAI(base_url="http://app/v1", api_key="none", http_client=c)
        answer = await sdk.chat.completions.create(
            model="m", messages=CHAT["messages"], n=2, extra_headers=ASK
        )
        for choice in answer.choices:
            assert choice.model_extra is not None
            assert choice.model_extra["weight_versions"] == answer_versions(choice.index)
            assert choice.weight_versions == answer_versions(choice.index)  # type: ignore[attr-defined]
        plain_answer = await sdk.chat.completions.create(model="m", messages=CHAT["messages"], n=2)
        assert all("weight_versions" not in (c.model_extra or {}) for c in plain_answer.choices)

    app = create_app(_settings("m"), plain, Pair(streamed_with_versions, TWO))
    async with app_client(app) as c:
        sdk = openai.AsyncOpenAI(base_url="http://app/v1", api_key="none", http_client=c)
        stream = await sdk.completions.create(
            model="m", prompt=["a", "b"], n=2, stream=True, extra_headers=ASK
        )
        got = {
            choice.index: (choice.model_extra or {}).get("weight_versions")
            async for chunk in stream
            for choice in chunk.choices
            if choice.finish_reason is not None
        }
    assert got == {k: answer_versions(k) for k in range(4)}


# -- the Messages API: vLLM's Messages serving over the chat answer ---------------------------

MESSAGES = {
    "max_tokens": 8,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
}
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


class Recorded(Pair):
    """``Pair``, with the bodies render was asked to render."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rendered: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            self.rendered.append(json.loads(await request.aread()))
        return await super().handle_async_request(request)


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The Messages stream's ``event:``/``data:`` pairs."""
    out = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_a_message_is_answered_in_the_messages_shape(plain, tokenizer):
    t = Recorded(
        whole({"index": 0, "token_ids": ended(tokenizer, "hello"), "finish_reason": "stop"})
    )
    r = await post(plain, t, "/v1/messages", MESSAGES)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["type"], answer["role"]) == ("message", "assistant")
    assert answer["content"] == [{"type": "text", "text": "hello"}]
    assert answer["stop_reason"] == "end_turn"
    assert answer["usage"]["input_tokens"] == len(PROMPT)
    assert answer["usage"]["output_tokens"] == len(ended(tokenizer, "hello"))
    # Render got the chat request vLLM's Messages serving makes of the body.
    (chat,) = t.rendered
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assert chat["max_tokens"] == 8


async def test_tool_use_is_answered_as_a_tool_use_block(parsed, tokenizer):
    text = '</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t = Pair(whole({"index": 0, "token_ids": ended(tokenizer, text), "finish_reason": "stop"}))
    r = await post(parsed, t, "/v1/messages", {**MESSAGES, "tools": ANTHROPIC_TOOLS})
    assert r.status_code == 200, r.text
    answer = r.json()
    (block,) = [b for b in answer["content"] if b["type"] == "tool_use"]
    assert (block["name"], block["input"]) == ("get_weather", {"city": "Paris"})
    assert answer["stop_reason"] == "tool_use"


async def test_a_streamed_message_is_streamed_as_messages_events(plain, tokenizer):
    tokens = ended(tokenizer, "hello there")
    chunks = [[{"index": 0, "token_ids": [x]}] for x in tokens[:-1]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    r = await post(plain, Pair(streamed(*chunks)), "/v1/messages", {**MESSAGES, "stream": True})
    assert r.status_code == 200, r.text
    assert b"[DONE]" not in r.content  # OpenAI's end, not the Messages API's
    sent = sse(r.content)
    kinds = [k for k, _ in sent]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    text = "".join(d["delta"]["text"] for k, d in sent if k == "content_block_delta")
    assert text == "hello there"
    (delta,) = [d for k, d in sent if k == "message_delta"]
    assert delta["delta"]["stop_reason"] == "end_turn"


async def test_count_tokens_counts_the_rendered_prompt(plain):
    t = Recorded(whole())
    body = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
    r = await post(plain, t, "/v1/messages/count_tokens", body)
    assert r.status_code == 200, r.text
    n = len(PROMPT)
    assert r.json() == {"input_tokens": n, "context_management": {"original_input_tokens": n}}
    assert t.generated == []  # counted, not generated
    assert t.rendered[0]["messages"][1] == {"role": "user", "content": "hi"}


async def test_a_body_vllm_refuses_is_a_typed_400(plain):
    r = await post(plain, Pair(whole()), "/v1/messages", {"messages": MESSAGES["messages"]})
    assert r.status_code == 400
    assert "max_tokens" in r.json()["error"]["message"]


class RenderRefusing(Pair):
    """``Pair`` whose render refuses every request (400, "no such image")."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host == "r1":
            error = {"message": "no such image", "type": "BadRequestError", "code": 400}
            return httpx.Response(400, json={"error": error})
        return await super().handle_async_request(request)


async def test_a_render_refusal_is_answered_in_the_messages_error_shape(plain):
    r = await post(plain, RenderRefusing(whole()), "/v1/messages", MESSAGES)
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "BadRequestError", "message": "no such image"},
    }
