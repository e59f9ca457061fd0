"""The `openai` SDK's Responses API (as released) against the front door and against
`vllm serve` on the same model: answers whole and streamed (text, instructions, earlier turns
as input items, an image, function tools rendered into the template (the session fleet has no
tool parser, so the answer is text on both), logprobs, a cut at max_output_tokens), the same
(greedy; ids and times are each server's own, and so is the prefix cache behind
``cached_tokens``); the refusals of a server without the Responses store (vLLM's
default), the same; and, with the store on both sides, a background stream."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tools.servers import serving, tandem_front, upstream_serve

from ..support.images import data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def clients(fleet, front_door) -> list[openai.OpenAI]:
    _, urls = fleet
    door, _ = front_door
    return [
        openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        for base in (door, urls["up_serve"])
    ]


def requests(model: str) -> dict[str, dict[str, Any]]:
    image = {"type": "input_image", "image_url": data_url(png_bytes(96, 64, seed=23))}
    return {
        "text": {"model": model, "input": "Name three colours.", "max_output_tokens": 12},
        "instructions and turns": {
            "model": model,
            "instructions": "Answer in French.",
            "input": [
                {"role": "user", "content": "Hello."},
                {"role": "assistant", "content": "Bonjour."},
                {"role": "user", "content": "Name a colour."},
            ],
            "max_output_tokens": 16,
        },
        "image": {
            "model": model,
            "input": [
                {
                    "role": "user",
                    "content": [image, {"type": "input_text", "text": "What is this?"}],
                }
            ],
            "max_output_tokens": 10,
        },
        "tools in the template": {
            "model": model,
            "input": "What is the weather in Paris?",
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                }
            ],
            "max_output_tokens": 12,
        },
        "logprobs": {
            "model": model,
            "input": "Count.",
            "max_output_tokens": 6,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        },
    }


def comparable(response: Any) -> dict[str, Any]:
    out: dict[str, Any] = response.model_dump(exclude={"id", "created_at"})
    for item in out["output"]:
        item.pop("id", None)  # each server's own
    details = (out.get("usage") or {}).get("input_tokens_details") or {}
    details.pop("cached_tokens", None)  # each server's own prefix cache
    return out


CASES = ["text", "instructions and turns", "image", "tools in the template", "logprobs"]


@pytest.mark.parametrize("case", CASES)
def test_a_response_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    body = {**requests(model)[case], "temperature": 0.0}
    ours, theirs = (comparable(c.responses.create(**body)) for c in clients(fleet, front_door))
    assert ours == theirs
    assert ours["status"] == "incomplete"  # every case is cut at its max_output_tokens


@pytest.mark.parametrize("case", ["text", "image"])
def test_a_streamed_response_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    body = {**requests(model)[case], "temperature": 0.0, "stream": True}
    seen = []
    for client in clients(fleet, front_door):
        events = list(client.responses.create(**body))
        # How many tokens one delta carries is each engine's timing (vLLM merges the steps
        # its reader has not taken yet): a run of deltas is compared as its text.
        kinds = [
            k for i, k in enumerate(e.type for e in events) if i == 0 or k != events[i - 1].type
        ]
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        seen.append((kinds, deltas, comparable(events[-1].response)))
        assert [e.sequence_number for e in events] == list(range(len(events)))
    assert seen[0] == seen[1]
    assert seen[0][1]  # some text was streamed


def test_refusals_answer_as_vllm_serve(fleet, front_door):
    """Without the Responses store (vLLM's default): an earlier response is not found (404),
    nor can one be retrieved; background mode is refused (400). A body vLLM's server refuses
    is a typed 400 on both (ours names our error type, as every door refusal does)."""
    model, urls = fleet
    door, _ = front_door

    def both(method: str, path: str, body: dict[str, Any] | None = None) -> list[httpx.Response]:
        return [
            httpx.request(method, f"{base}{path}", json=body, timeout=60)
            for base in (door, urls["up_serve"])
        ]

    ask = {"model": model, "input": "Hi", "max_output_tokens": 4}
    for method, path, body in [
        ("POST", "/v1/responses", {**ask, "previous_response_id": "resp_unknown"}),
        ("GET", "/v1/responses/resp_unknown", None),
        ("POST", "/v1/responses", {**ask, "background": True}),
        ("POST", "/v1/responses", {**ask, "model": "x"}),
    ]:
        ours, theirs = both(method, path, body)
        assert ours.status_code == theirs.status_code, (path, body, ours.text, theirs.text)
        assert ours.json() == theirs.json(), (path, body)
    for answer in both("POST", "/v1/responses", {"model": model, "input": 5}):
        assert answer.status_code == 400
        assert isinstance(answer.json()["error"]["type"], str)


def test_usage_counts_the_prefix_cache_hits_as_vllm_serve(fleet, front_door):
    """The same image prompt twice: the second's prompt is in the prefix cache on both (the
    door's image affinity sends it to the node that holds it), and both count it."""
    model, _ = fleet
    image = {"type": "input_image", "image_url": data_url(png_bytes(96, 64, seed=29))}
    text = {"type": "input_text", "text": "Describe it. " * 150}  # past a cache block or two
    body = {
        "model": model,
        "input": [{"role": "user", "content": [image, text]}],
        "max_output_tokens": 4,
        "temperature": 0.0,
    }
    for client in clients(fleet, front_door):
        first = client.responses.create(**body)
        again = client.responses.create(**body)
        cached = again.usage.input_tokens_details.cached_tokens
        assert 0 < cached < again.usage.input_tokens, (first.usage, again.usage)


@pytest.fixture(scope="module")
def stored_pair(fleet_servers):
    """The door (one worker: each keeps its own store) and `vllm serve`, each with the
    Responses store on (`VLLM_ENABLE_RESPONSES_API_STORE`, read by each at start-up): the
    session's serve and door run without it, as vLLM's default."""
    model, procs = fleet_servers
    env = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    serve = upstream_serve(model, env=env)
    door = tandem_front(model, procs["render"].url, procs["generate"].url, env=env)
    with serving([serve, door], timeout=300):
        yield door.url, serve.url


@pytest.mark.own_fleet  # an engine of its own: run before the session's second generate
def test_a_background_stream_answers_as_vllm_serve(fleet, stored_pair):
    """`background` with `stream`: the run's events as they come, then the stored response
    (the door answered 500 here, reading the stream before its run had begun)."""
    model, _ = fleet
    body = {**requests(model)["text"], "temperature": 0.0, "background": True, "stream": True}
    seen = []
    for base in stored_pair:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        events = list(client.responses.create(**body))
        kinds = [
            k for i, k in enumerate(e.type for e in events) if i == 0 or k != events[i - 1].type
        ]
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        seen.append((kinds, deltas, comparable(final)))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert comparable(client.responses.retrieve(final.id)) == comparable(final)
    assert seen[0] == seen[1]
    assert seen[0][0][-1] == "response.completed" and seen[0][1]
