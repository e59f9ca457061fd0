"""The `anthropic` SDK (as released) against the front door and against `vllm serve` on the same
model: the Messages API's answers, whole and streamed, and its token counts, the same (greedy;
ids are each server's own). Tool use needs a tool parser; the door's Messages tool_use blocks are
tested on crafted answers through the hermes parser (tests/unit/front/test_front_answers.py)."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import httpx
import pytest

from ..support.images import png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]


def clients(fleet, front_door) -> list[anthropic.Anthropic]:
    _, urls = fleet
    door, _ = front_door
    return [
        anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
        for base in (door, urls["up_serve"])
    ]


def image_block() -> dict[str, Any]:
    data = base64.b64encode(png_bytes(96, 64, seed=21)).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def requests(model: str) -> dict[str, dict[str, Any]]:
    user = {"role": "user", "content": "Name three colours."}
    return {
        "text": {"model": model, "max_tokens": 12, "messages": [user]},
        "system and stop": {
            "model": model,
            "max_tokens": 24,
            "system": "Answer in French.",
            "stop_sequences": ["e"],
            "messages": [user],
        },
        "image": {
            "model": model,
            "max_tokens": 10,
            "messages": [
                {
                    "role": "user",
                    "content": [image_block(), {"type": "text", "text": "What is this?"}],
                }
            ],
        },
    }


def comparable(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = message.model_dump(exclude={"id"})
    for block in out["content"]:
        block.pop("id", None)  # a tool use's id is each server's own
    return out


CASES = ["text", "system and stop", "image"]


@pytest.mark.parametrize("case", CASES)
def test_a_message_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    body = {**requests(model)[case], "extra_body": {"temperature": 0.0}}
    ours, theirs = (comparable(c.messages.create(**body)) for c in clients(fleet, front_door))
    assert ours == theirs


@pytest.mark.parametrize("case", ["text", "image"])
def test_a_streamed_message_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    body = {**requests(model)[case], "extra_body": {"temperature": 0.0}}
    seen = []
    for client in clients(fleet, front_door):
        with client.messages.stream(**body) as stream:
            events = list(stream)
            # How many tokens one delta carries is each engine's timing (vLLM merges the
            # steps its reader has not taken yet): a run of deltas is compared as its text
            # (the SDK's own "text" event follows each delta: left out).
            sent = [e.type for e in events if e.type != "text"]
            kinds = [k for i, k in enumerate(sent) if i == 0 or k != sent[i - 1]]
            text = "".join(e.text for e in events if e.type == "text")
            seen.append((kinds, text, comparable(stream.get_final_message())))
    assert seen[0] == seen[1]
    assert seen[0][1]  # some text was streamed


@pytest.mark.parametrize("case", CASES)
def test_count_tokens_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    body = {
        k: v for k, v in requests(model)[case].items() if k not in ("max_tokens", "stop_sequences")
    }
    ours, theirs = (c.messages.count_tokens(**body) for c in clients(fleet, front_door))
    assert ours.input_tokens == theirs.input_tokens > 0


def test_refusals_answer_as_vllm_serve(fleet, front_door):
    """A body vLLM's server refuses (no max_tokens): a 400 with a typed error on both (ours
    names our error type, as every door refusal does). One its serving refuses (a model the
    server does not serve): the same status and the Messages error shape."""
    model, urls = fleet
    door, _ = front_door
    user = [{"role": "user", "content": "Hi"}]

    def both(body: dict[str, Any]) -> list[httpx.Response]:
        return [
            httpx.post(f"{base}/v1/messages", json=body, timeout=60)
            for base in (door, urls["up_serve"])
        ]

    for answer in both({"model": model, "messages": user}):
        assert answer.status_code == 400
        assert isinstance(answer.json()["error"]["type"], str)
    ours, theirs = both({"model": "x", "max_tokens": 4, "messages": user})
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)
    assert shape(ours.json()) == shape(theirs.json()), (ours.text, theirs.text)


def shape(document: Any) -> Any:
    """The keys of a document, nested (messages differ in wording)."""
    if isinstance(document, dict):
        return {k: shape(v) for k, v in document.items()}
    return type(document).__name__
