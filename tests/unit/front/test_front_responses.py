"""The door's Responses API (``/v1/responses``), written by vLLM's own Responses serving over
crafted render and generate answers: vLLM builds the chat a render node renders (instructions,
earlier turns, tools), resolves the sampling generate gets, and writes the answer, whole or as
its events; refusals of either hop pass unchanged; the store, retrieve and cancel as
``vllm serve`` has them (``VLLM_ENABLE_RESPONSES_API_STORE``)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
import pytest

from tandem_front.app import create_app
from tandem_wire import PROMPT_TOKENS_DETAILS_HEADER
from tests.support.asgi import app_client

from .conftest import door_settings
from .test_front_answers import (
    PROMPT,
    TOOLS,
    Pair,
    Recorded,
    RenderRefusing,
    ended,
    ids,
    sse,
    streamed,
    whole,
)
from .test_front_proxy_failures import _Stream

pytestmark = pytest.mark.anyio

ASK = {"input": "hi", "instructions": "Be brief.", "temperature": 0.0}


@pytest.fixture(scope="module")
def stored(model_dir):
    """vLLM's answer side with the Responses store on, as ``vllm serve`` turns it on."""
    from tandem_front.vllm_answers import VllmAnswers

    os.environ["VLLM_ENABLE_RESPONSES_API_STORE"] = "1"
    try:
        return VllmAnswers(door_settings(model_dir))
    finally:
        del os.environ["VLLM_ENABLE_RESPONSES_API_STORE"]


async def call(answers, transport: Pair, *steps: tuple[str, str, dict[str, Any] | None]):
    """Each (method, path, body) in turn through one door; the answers."""
    app = create_app(door_settings("m"), answers, transport)
    out = []
    async with app_client(app) as c:
        for method, path, body in steps:
            out.append(await c.request(method, path, json=body))
    return out


def text_of(answer: dict[str, Any]) -> str:
    (message,) = [o for o in answer["output"] if o["type"] == "message"]
    return "".join(c["text"] for c in message["content"])


async def test_a_response_is_rendered_generated_and_written_by_vllm(plain, tokenizer, model_dir):
    tokens = ended(tokenizer, "hello")
    t = Recorded(whole({"index": 0, "token_ids": tokens, "finish_reason": "stop"}))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "max_output_tokens": 9}))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["object"], answer["status"]) == ("response", "completed")
    assert answer["model"] == model_dir  # the served name, as no model was asked
    assert text_of(answer) == "hello"
    usage = answer["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (len(PROMPT), len(tokens))
    # Render got vLLM's messages for the request, with its template arguments.
    (chat,) = t.rendered
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert chat["chat_template_kwargs"]["add_generation_prompt"] is True
    # Generate got the sampling vLLM's Responses serving resolved (not render's).
    (gen,) = t.generated
    assert gen["sampling_params"]["max_tokens"] == 9
    assert gen["sampling_params"]["temperature"] == 0.0
    assert gen["token_ids"] == PROMPT and gen["stream"] is False


async def test_a_response_cut_at_max_output_tokens_is_incomplete(plain, tokenizer):
    tokens = tokenizer.encode("one two", add_special_tokens=False)
    t = Pair(whole({"index": 0, "token_ids": tokens, "finish_reason": "length"}))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "max_output_tokens": 2}))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "incomplete"


async def test_a_streamed_response_is_sent_as_vllms_events(plain, tokenizer):
    tokens = ended(tokenizer, "hello there")
    chunks = [[{"index": 0, "token_ids": [x]}] for x in tokens[:-1]]
    chunks.append([{"index": 0, "token_ids": tokens[-1:], "finish_reason": "stop"}])
    t = Pair(streamed(*chunks))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "stream": True}))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    sent = sse(r.content)
    kinds = [k for k, _ in sent]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in sent] == list(range(len(sent)))
    deltas = "".join(d["delta"] for k, d in sent if k == "response.output_text.delta")
    assert deltas == "hello there"
    assert text_of(sent[-1][1]["response"]) == "hello there"
    assert t.generated[0]["stream"] is True


async def test_a_function_call_is_answered_as_a_function_call_item(parsed, tokenizer):
    text = '</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    t = Recorded(whole({"index": 0, "token_ids": ended(tokenizer, text), "finish_reason": "stop"}))
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    (r,) = await call(parsed, t, ("POST", "/v1/responses", {**ASK, "tools": tools}))
    assert r.status_code == 200, r.text
    (item,) = [o for o in r.json()["output"] if o["type"] == "function_call"]
    assert item["name"] == "get_weather"
    assert item["arguments"] == '{"city": "Paris"}'
    # The tools reach the template as vLLM's Responses serving gives them.
    (chat,) = t.rendered
    assert [d["function"]["name"] for d in chat["chat_template_kwargs"]["tools"]] == ["get_weather"]


async def test_a_render_refusal_passes_unchanged(plain):
    for stream in (False, True):
        t = RenderRefusing(whole())
        (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "stream": stream}))
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "no such image"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_generate_refusal_is_an_http_answer_streamed_or_not(plain, stream):
    error = {"message": "prompt too long", "type": "prompt_too_long", "code": 400}
    t = Pair(lambda gen: httpx.Response(400, json={"error": error}))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "stream": stream}))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "prompt_too_long"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": 5}, "input"),
        ({"input": "hi", "kv_transfer_params": {"x": 1}}, "kv_transfer_params"),
        # vLLM's validators and its answer's model: values that would fail past validation.
        ({"input": "hi", "tools": 0}, "body is not valid"),
        ({"input": "hi", "background": None}, "background"),
        ({"input": "hi", "truncation": None}, "truncation"),
    ],
)
async def test_a_body_the_door_refuses_is_a_typed_400_before_render(plain, body, param):
    t = Recorded(whole())
    (r,) = await call(plain, t, ("POST", "/v1/responses", body))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request"
    assert param in r.json()["error"]["message"] or r.json()["error"].get("param") == param
    assert t.rendered == []


async def test_without_the_store_earlier_responses_are_not_found_as_upstream(plain, tokenizer):
    t = Pair(whole({"index": 0, "token_ids": ended(tokenizer, "a"), "finish_reason": "stop"}))
    first, again, follow = await call(
        plain,
        t,
        ("POST", "/v1/responses", ASK),
        ("GET", "/v1/responses/resp_x", None),
        ("POST", "/v1/responses", {**ASK, "previous_response_id": "resp_x"}),
    )
    assert first.status_code == 200
    assert again.status_code == 404 and follow.status_code == 404
    assert follow.json()["error"]["type"] == "invalid_request_error"


async def test_a_stored_response_is_retrieved_and_continued(stored, tokenizer):
    t = Recorded(
        whole({"index": 0, "token_ids": ended(tokenizer, "Paris"), "finish_reason": "stop"})
    )
    first, *_ = await call(stored, t, ("POST", "/v1/responses", ASK))
    rid = first.json()["id"]
    got, follow, cancel = await call(
        stored,
        t,
        ("GET", f"/v1/responses/{rid}", None),
        ("POST", "/v1/responses", {**ASK, "input": "And?", "previous_response_id": rid}),
        ("POST", f"/v1/responses/{rid}/cancel", None),
    )
    assert got.status_code == 200 and got.json() == first.json()
    assert follow.status_code == 200, follow.text
    # The earlier turn and its answer come before the new input (instructions do not carry).
    assert t.rendered[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And?"},
    ]
    # Only a background response can be cancelled, as upstream says.
    assert cancel.status_code == 400, cancel.text


async def test_input_images_reach_render_as_the_chat_parts_vllm_reads_them_as(plain, tokenizer):
    url = "data:image/png;base64,iVBORw0KGgo="
    content = [
        {"type": "input_image", "image_url": url, "detail": "low"},
        {"type": "input_text", "text": "What is this?"},
    ]
    turns = [
        {"role": "user", "content": content},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "A cat.", "annotations": []}],
        },
    ]
    t = Recorded(whole({"index": 0, "token_ids": ended(tokenizer, "a"), "finish_reason": "stop"}))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {"input": turns}))
    assert r.status_code == 200, r.text
    (chat,) = t.rendered
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
        {"type": "input_text", "text": "What is this?"},
    ]
    assert chat["messages"][1] == {"role": "assistant", "content": "A cat."}


def test_a_store_split_across_door_workers_is_warned_of(model_dir, caplog, monkeypatch):
    from tandem_front.vllm_answers import VllmAnswers

    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    with caplog.at_level("WARNING", logger="tandem_front.vllm_answers"):
        VllmAnswers(door_settings(model_dir, workers=2))
    assert "found only by the worker that made it" in caplog.text


async def test_a_generate_answer_vllm_cannot_read_is_the_nodes_fault(plain, tokenizer):
    # No choice at all (whole), or a stream that ends before its answer did: a 502.
    (r,) = await call(plain, Pair(whole()), ("POST", "/v1/responses", ASK))
    assert (r.status_code, r.json()["error"]["type"]) == (502, "upstream_error")
    cut = Pair(streamed([{"index": 0, "token_ids": ids(tokenizer, "hel")}]))
    (r,) = await call(plain, cut, ("POST", "/v1/responses", {**ASK, "stream": True}))
    assert r.status_code == 200  # the stream had begun
    *_, error, done = [e for e in r.text.split("\n\n") if e]
    assert '"upstream_error"' in error and done == "data: [DONE]", r.text[-400:]


async def test_a_background_response_runs_on_after_its_request_and_can_be_cancelled(
    stored, tokenizer
):
    """With the store on: a background response is answered ``queued`` at once and runs in
    the door worker; retrieve shows it, cancel stops it (vLLM's own bookkeeping)."""
    release = asyncio.Event()

    class Held(Pair):
        """Generate answers only once ``release`` is set."""

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.host != "r1" and request.method == "POST":
                await release.wait()
            return await super().handle_async_request(request)

    t = Held(whole({"index": 0, "token_ids": ended(tokenizer, "done"), "finish_reason": "stop"}))
    app = create_app(door_settings("m"), stored, t)
    async with app_client(app) as c:
        first = (await c.post("/v1/responses", json={**ASK, "background": True})).json()
        second = (await c.post("/v1/responses", json={**ASK, "background": True})).json()
        assert first["status"] == second["status"] == "queued"
        cancelled = await c.post(f"/v1/responses/{first['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        release.set()
        for _ in range(1000):  # the second runs to its end in the background
            answer = (await c.get(f"/v1/responses/{second['id']}")).json()
            if answer["status"] == "completed":
                break
            await asyncio.sleep(0.01)
        assert text_of(answer) == "done"
        assert (await c.get(f"/v1/responses/{first['id']}")).json()["status"] == "cancelled"


class Asked(Pair):
    """``Pair``, with the headers and bodies of the generate requests."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.headers: list[httpx.Headers] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "r1" and request.method == "POST":
            self.headers.append(request.headers)
        return await super().handle_async_request(request)


def with_usage(tokens: list[int], cached: int) -> Any:
    """A generate stream: one event per token, then the usage chunk telling ``cached``."""

    async def source() -> Any:
        for k, token in enumerate(tokens):
            end = "stop" if k == len(tokens) - 1 else None
            choice = {"index": 0, "token_ids": [token], "finish_reason": end}
            yield b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
        usage = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": cached}}
        yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def answer(gen: dict[str, Any]) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Stream(source()))

    return answer


async def test_usage_counts_the_prefix_cache_hits_generate_tells(plain, tokenizer):
    tokens = ended(tokenizer, "hi there")
    details = {"prompt_tokens_details": {"cached_tokens": 16}}
    t = Asked(whole({"index": 0, "token_ids": tokens, "finish_reason": "stop"}, usage=details))
    (r,) = await call(plain, t, ("POST", "/v1/responses", ASK))
    assert r.json()["usage"]["input_tokens_details"]["cached_tokens"] == 16
    t = Asked(with_usage(tokens, 32))
    (r,) = await call(plain, t, ("POST", "/v1/responses", {**ASK, "stream": True}))
    *_, (kind, last) = sse(r.content)
    assert kind == "response.completed", r.text[-300:]
    assert last["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 32
    assert text_of(last["response"]) == "hi there"
    # Generate was asked for them (streamed: in the usage chunk).
    assert t.headers[0][PROMPT_TOKENS_DETAILS_HEADER] == "true"
    assert t.generated[0]["stream_options"] == {"include_usage": True}
