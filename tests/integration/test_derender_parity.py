"""Parity with `vllm launch render` on the routes beyond chat/completion render: the two derender
routes (whole answers, and streamed chunks carrying ``stream_state``) with vLLM's hermes tool
parser and deepseek_r1 reasoning parser, and the Responses and Messages render routes with
images. Answers are compared field for field; only ``created`` (the clock) and tool-call ids
(random uuids, also kept in ``stream_state.last_tool_call_ids``) are left out."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import httpx
import pytest

from tools.servers import serving, tandem_render, upstream_render

from ..support.images import data_url, png_bytes
from ..support.parser_model import MARKUP, PARSER_FLAGS, parser_model
from .test_render_parity import assert_same_request

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.own_fleet]

CHAT_DERENDER = "/v1/chat/completions/derender"
COMPLETION_DERENDER = "/v1/completions/derender"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Upstream's and our render, both with the tool-call and reasoning parsers, on the tiny
    Qwen2-VL whose tokenizer holds the markup (render only: no engine)."""
    model = str(parser_model(tmp_path_factory.mktemp("models")))
    upstream = upstream_render(model, *PARSER_FLAGS)
    ours = tandem_render(model, *PARSER_FLAGS)
    with serving([upstream, ours]):
        yield model, upstream.url, ours.url


@pytest.fixture(scope="module")
def tokenizer(servers):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(servers[0])
    # Each markup string is one token of its own, as in the real checkpoints.
    assert [len(tok.encode(m, add_special_tokens=False)) for m in MARKUP] == [1] * len(MARKUP)
    return tok


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    r = httpx.post(url + path, json=body, timeout=120)
    return r.status_code, r.json()


def both(servers: tuple[str, str, str], path: str, body: Any) -> tuple[Any, Any]:
    """(ours, upstream's) answers to ``body``, each a 200."""
    _, upstream, ours = servers
    (code_a, mine), (code_b, theirs) = post(ours, path, body), post(upstream, path, body)
    assert (code_a, code_b) == (200, 200), (mine, theirs)
    return mine, theirs


def comparable(answer: Any) -> Any:
    """The answer without what is random or the clock's: ``created``, tool-call ids."""
    if isinstance(answer, dict):
        out = {}
        for key, value in answer.items():
            if key == "created" or key == "last_tool_call_ids":
                continue
            if key == "tool_calls" and isinstance(value, list):
                value = [{**c, "id": None} if isinstance(c, dict) else c for c in value]
            out[key] = comparable(value)
        return out
    if isinstance(answer, list):
        return [comparable(v) for v in answer]
    return answer


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "unit": "c"}}\n</tool_call>'
)

# name -> (generated text, chat request extras, what the parsed answer must hold)
CHAT_CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "reasoning then a tool call": (
        "<think>The user wants the weather.</think>Let me check." + TOOL_CALL % "Paris",
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
        {"reasoning": True, "content": True, "tools": ["get_weather"]},
    ),
    "two tool calls": (
        "<think>two cities</think>" + TOOL_CALL % "Paris" + "\n" + TOOL_CALL % "Oslo",
        {"tools": [WEATHER_TOOL], "tool_choice": "auto"},
        {"reasoning": True, "tools": ["get_weather", "get_weather"]},
    ),
    "reasoning then text, logprobs": (
        "<think>2 plus 2</think>The answer is 4.",
        {"logprobs": True, "top_logprobs": 2},
        {"reasoning": True, "content": True},
    ),
    "reasoning never closed": (
        "<think>still thinking about it",
        {},
        {"reasoning": True},
    ),
}


def chat_request(model: str, extras: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "weather?"}], **extras}


def prompt_ids(servers: tuple[str, str, str], chat: dict[str, Any]) -> list[int]:
    """The prompt's token ids as upstream renders the chat request."""
    _, upstream, _ = servers
    code, rendered = post(upstream, "/v1/chat/completions/render", chat)
    assert code == 200, rendered
    return list(rendered["token_ids"])


def fake_logprobs(ids: list[int]) -> dict[str, Any]:
    """A generate answer's logprobs for ``ids`` (what the engine would send, made up)."""
    return {
        "content": [
            {
                "token_id": t,
                "logprob": -0.25 * (i % 3),
                "rank": 1,
                "top_logprobs": [
                    {"token_id": t, "logprob": -0.25 * (i % 3), "rank": 1},
                    {"token_id": (t + 1) % 1000, "logprob": -3.5, "rank": 2},
                ],
            }
            for i, t in enumerate(ids)
        ]
    }


def check_parsed(message: dict[str, Any], expect: dict[str, Any]) -> None:
    """The answer really went through the parsers (not two equal unparsed texts)."""
    assert bool(message.get("reasoning")) == expect.get("reasoning", False)
    assert [c["function"]["name"] for c in message.get("tool_calls") or []] == expect.get(
        "tools", []
    )
    assert bool(message.get("content")) == expect.get("content", False)
    for markup in MARKUP:
        assert markup not in (message.get("content") or "")


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_derender_whole_matches_upstream(servers, tokenizer, case):
    model = servers[0]
    text, extras, expect = CHAT_CASES[case]
    ids = tokenizer.encode(text, add_special_tokens=False)
    chat = chat_request(model, extras)
    prompt = prompt_ids(servers, chat)
    choice: dict[str, Any] = {"index": 0, "token_ids": ids, "finish_reason": "stop"}
    if extras.get("logprobs"):
        choice["logprobs"] = fake_logprobs(ids)
    body = {
        "model": model,
        "generate_response": {"request_id": "chatcmpl-parity", "choices": [choice]},
        "prompt_tokens": len(prompt),
        "prompt_token_ids": prompt,
        "chat_request": chat,
    }
    mine, theirs = both(servers, CHAT_DERENDER, body)
    assert comparable(mine) == comparable(theirs)
    check_parsed(mine["choices"][0]["message"], expect)
    assert mine["id"] == "chatcmpl-parity"
    if extras.get("logprobs"):
        assert len(mine["choices"][0]["logprobs"]["content"]) == len(ids)


CHUNK_SIZES = (1, 4, 2, 7, 3)
"""Uneven chunk lengths, cycled: markup split across chunks and several tokens per chunk."""


def chunks(ids: list[int]) -> list[list[int]]:
    out, start = [], 0
    for size in itertools.cycle(CHUNK_SIZES):
        if start >= len(ids):
            return out
        out.append(ids[start : start + size])
        start += size
    raise AssertionError("unreachable")


def merged_delta(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """Streamed deltas folded into one message (text joined, tool calls by index)."""
    reasoning = "".join(d.get("reasoning") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for c in d.get("tool_calls") or []:
            call = calls.setdefault(c["index"], {"function": {"name": "", "arguments": ""}})
            call["function"]["name"] += c["function"].get("name") or ""
            call["function"]["arguments"] += c["function"].get("arguments") or ""
    return {"reasoning": reasoning, "content": content, "tool_calls": list(calls.values())}


@pytest.mark.parametrize("case", sorted(CHAT_CASES))
def test_chat_derender_stream_matches_upstream(servers, tokenizer, case):
    # Each server gets back the stream_state it answered last, as a coordinator carries it.
    model = servers[0]
    text, extras, expect = CHAT_CASES[case]
    ids = tokenizer.encode(text, add_special_tokens=False)
    chat = chat_request(model, {**extras, "stream": True})
    prompt = prompt_ids(servers, chat)
    parts = chunks(ids)
    states: dict[str, Any] = {"ours": None, "theirs": None}
    deltas = []
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        choice: dict[str, Any] = {
            "index": 0,
            "token_ids": part,
            "finish_reason": "stop" if last else None,
        }
        if extras.get("logprobs"):
            choice["logprobs"] = fake_logprobs(part)
        chunk = {"request_id": "chatcmpl-parity", "choices": [choice]}
        answers = {}
        for who, url in (("ours", servers[2]), ("theirs", servers[1])):
            body = {
                "stream": True,
                "model": model,
                "generate_chunk": chunk,
                "stream_state": states[who],
                "prompt_tokens": len(prompt),
                "prompt_token_ids": prompt,
                "chat_request": chat,
            }
            code, answers[who] = post(url, CHAT_DERENDER, body)
            assert code == 200, answers[who]
            states[who] = answers[who]["stream_state"]
        assert comparable(answers["ours"]) == comparable(answers["theirs"]), n
        deltas += [c["delta"] for c in answers["ours"]["chunk"]["choices"]]
    folded = merged_delta(deltas)
    assert bool(folded["reasoning"]) == expect.get("reasoning", False)
    assert [c["function"]["name"] for c in folded["tool_calls"]] == expect.get("tools", [])
    assert states["ours"]["output_token_ids"] == ids


COMPLETION_TEXT = "the quick brown fox jumps over the lazy dog"


def test_completion_derender_whole_matches_upstream(servers, tokenizer):
    model = servers[0]
    ids = tokenizer.encode(COMPLETION_TEXT, add_special_tokens=False)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in ("a b", "c d e")]
    body = {
        "model": model,
        "generate_responses": [
            {
                "request_id": f"cmpl-parity-{i}",
                "choices": [
                    {
                        "index": 0,
                        "token_ids": ids[i:],
                        "finish_reason": "length",
                        "logprobs": fake_logprobs(ids[i:]),
                    }
                ],
            }
            for i in range(2)
        ],
        "prompt_tokens": [len(p) for p in prompts],
        "prompt_token_ids": prompts,
        "completion_request": {"model": model, "prompt": ["a b", "c d e"], "logprobs": 1},
    }
    mine, theirs = both(servers, COMPLETION_DERENDER, body)
    assert comparable(mine) == comparable(theirs)
    assert [c["text"] for c in mine["choices"]][0] == COMPLETION_TEXT
    assert mine["choices"][0]["logprobs"]["tokens"]


def test_completion_derender_stream_matches_upstream(servers, tokenizer):
    model = servers[0]
    ids = tokenizer.encode(COMPLETION_TEXT, add_special_tokens=False)
    request = {"model": model, "prompt": "a b", "logprobs": 1, "stream": True}
    states: dict[str, Any] = {"ours": None, "theirs": None}
    text = ""
    parts = chunks(ids)
    for n, part in enumerate(parts):
        choice = {
            "index": 0,
            "token_ids": part,
            "finish_reason": "length" if n == len(parts) - 1 else None,
            "logprobs": fake_logprobs(part),
        }
        answers = {}
        for who, url in (("ours", servers[2]), ("theirs", servers[1])):
            body = {
                "stream": True,
                "model": model,
                "generate_chunk": {"request_id": "cmpl-parity", "choices": [choice]},
                "stream_state": states[who],
                "prompt_tokens": 2,
                "completion_request": request,
            }
            code, answers[who] = post(url, COMPLETION_DERENDER, body)
            assert code == 200, answers[who]
            states[who] = answers[who]["stream_state"]
        assert comparable(answers["ours"]) == comparable(answers["theirs"]), n
        text += "".join(c["text"] for c in answers["ours"]["chunk"]["choices"])
    assert text == COMPLETION_TEXT


BAD_DERENDER = {
    "chat without chat_request (parsers on)": (
        CHAT_DERENDER,
        {"generate_response": {"request_id": "x", "choices": [{"index": 0, "token_ids": [5]}]}},
    ),
    "stream chunk with two choices": (
        CHAT_DERENDER,
        {
            "stream": True,
            "generate_chunk": {
                "request_id": "x",
                "choices": [{"index": 0, "token_ids": [5]}, {"index": 1, "token_ids": [6]}],
            },
            "prompt_token_ids": [1],
            "chat_request": {"messages": [{"role": "user", "content": "hi"}]},
        },
    ),
    "completion with no responses": (COMPLETION_DERENDER, {"generate_responses": []}),
}


@pytest.mark.parametrize("case", sorted(BAD_DERENDER))
def test_bad_derender_is_a_400_as_upstream(servers, case):
    path, body = BAD_DERENDER[case]
    _, upstream, ours = servers
    (code_a, mine), (code_b, theirs) = post(ours, path, body), post(upstream, path, body)
    assert code_a == code_b == 400
    assert mine["error"]["type"] == theirs["error"]["type"]


def png_b64(seed: int) -> str:
    return base64.b64encode(png_bytes(seed=seed)).decode()


RESPONSES_CASES = {
    "image and text, instructions": lambda m: {
        "model": m,
        "request_id": "resp-parity-1",
        "instructions": "be brief",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": data_url(png_bytes(seed=31))},
                ],
            }
        ],
        "max_output_tokens": 7,
        "temperature": 0.5,
    },
    "two images, tools, transfer params": lambda m: {
        "model": m,
        "request_id": "resp-parity-2",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(png_bytes(160, 224, seed=s))}
                    for s in (32, 33)
                ],
            },
            {"role": "assistant", "content": "I see two pictures."},
            {"role": "user", "content": "and the weather?"},
        ],
        "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
        "kv_transfer_params": {"do_remote_decode": True},
    },
    "text only": lambda m: {"model": m, "request_id": "resp-parity-3", "input": "hello"},
}


@pytest.mark.parametrize("case", sorted(RESPONSES_CASES))
def test_responses_render_matches_upstream(servers, case):
    model = servers[0]
    mine, theirs = both(servers, "/v1/responses/render", RESPONSES_CASES[case](model))
    assert_same_request(mine, theirs, model)


MESSAGES_CASES = {
    "base64 image, system": lambda m: {
        "model": m,
        "max_tokens": 9,
        "system": "be brief",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": png_b64(41),
                        },
                    },
                    {"type": "text", "text": "what is this?"},
                ],
            }
        ],
    },
    "url image, tool use and a tool result with an image": lambda m: {
        "model": m,
        "max_tokens": 5,
        "tools": [
            {
                "name": "get_weather",
                "description": "the weather in a city",
                "input_schema": WEATHER_TOOL["function"]["parameters"],
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "url", "url": data_url(png_bytes(seed=42))},
                    },
                    {"type": "text", "text": "weather where this is?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "rain, see map"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": png_b64(43),
                                },
                            },
                        ],
                    }
                ],
            },
        ],
    },
}


@pytest.mark.parametrize("case", sorted(MESSAGES_CASES))
def test_messages_render_matches_upstream(servers, case):
    model = servers[0]
    mine, theirs = both(servers, "/v1/messages/render", MESSAGES_CASES[case](model))
    assert_same_request(mine, theirs, model)
    assert mine["features"]["mm_hashes"]["image"]


def test_chat_render_with_tools_matches_upstream(servers):
    # tool_choice auto needs --enable-auto-tool-choice on render too; the reasoning parser
    # makes render write reasoning_ended and its kwargs.
    model = servers[0]
    body = chat_request(model, {"tools": [WEATHER_TOOL], "tool_choice": "auto", "max_tokens": 8})
    mine, theirs = both(servers, "/v1/chat/completions/render", body)
    assert_same_request(mine, theirs, model)
    assert mine["reasoning_parser_kwargs"] is not None
    assert json.dumps(mine["sampling_params"])  # a plain JSON document
