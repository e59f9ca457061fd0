"""The door's tokenizer and server-info routes against ``vllm serve`` on the same model: the
same requests, the same answers (token for token), as eval harnesses count tokens."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ..support.images import chat_body, data_url, png_bytes

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def both(fleet, front_door, path: str, body: dict[str, Any] | None = None) -> list[httpx.Response]:
    _, urls = fleet
    door, _ = front_door
    answers = []
    for base in (door, urls["up_serve"]):
        if body is None:
            answers.append(httpx.get(base + path, timeout=60))
        else:
            answers.append(httpx.post(base + path, json=body, timeout=120))
    return answers


def tokenize_bodies(model: str) -> dict[str, dict[str, Any]]:
    image = data_url(png_bytes(96, 64, seed=9))
    return {
        "prompt": {"model": model, "prompt": "Count these tokens, please."},
        "prompt without specials": {
            "model": model,
            "prompt": "Count these tokens, please.",
            "add_special_tokens": False,
            "return_token_strs": True,
        },
        "chat with an image": {**chat_body(model, [image]), "return_token_strs": True},
        "chat, no generation prompt": {
            "model": model,
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hel"},
            ],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    }


@pytest.mark.parametrize(
    "case",
    ["prompt", "prompt without specials", "chat with an image", "chat, no generation prompt"],
)
def test_tokenize_answers_as_vllm_serve(fleet, front_door, case):
    model, _ = fleet
    ours, theirs = both(fleet, front_door, "/tokenize", tokenize_bodies(model)[case])
    assert theirs.status_code == 200, theirs.text
    assert ours.status_code == 200, ours.text
    assert ours.json() == theirs.json()


def test_detokenize_answers_as_vllm_serve(fleet, front_door):
    model, _ = fleet
    (tokenized, _) = both(fleet, front_door, "/tokenize", tokenize_bodies(model)["prompt"])
    body = {"model": model, "tokens": tokenized.json()["tokens"]}
    ours, theirs = both(fleet, front_door, "/detokenize", body)
    assert ours.status_code == theirs.status_code == 200
    assert ours.json() == theirs.json()


def test_version_ping_and_load_answer_as_vllm_serve(fleet, front_door):
    ours, theirs = both(fleet, front_door, "/version")
    assert ours.json() == theirs.json()
    for method in ("GET", "POST"):
        _, urls = fleet
        door, _ = front_door
        for base in (door, urls["up_serve"]):
            assert httpx.request(method, base + "/ping", timeout=30).status_code == 200
    ours, theirs = both(fleet, front_door, "/load")
    assert set(ours.json()) == set(theirs.json()) == {"server_load"}
    assert isinstance(ours.json()["server_load"], int)


def test_a_token_past_the_vocabulary_is_a_typed_400_at_the_door(fleet, front_door):
    model, _ = fleet
    door, _ = front_door
    r = httpx.post(door + "/detokenize", json={"model": model, "tokens": [10**7]}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "token_out_of_vocabulary"
