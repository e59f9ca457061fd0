"""Every model family users bring, answered as vLLM answers it.

For each family's tiny checkpoint (``tools.tiny_families``; Qwen2.5-VL beside them, Qwen2-VL,
Qwen3-VL and Qwen2-Audio have suites of their own), and each chat a user sends (text only, one
image, two images of different sizes, an image in an earlier turn, a video where the family
takes one):

- the door's OpenAI answer equals ``vllm serve``'s, field for field (prompt tokens, tokens,
  logprobs);
- ``tandem_client``'s render -> generate gives ``vllm serve``'s prompt length, tokens and
  logprobs;
- render's answer equals upstream render's, field for field (``test_render_parity``'s
  rules).

``vllm serve`` answers every case of a family and stops, then our generate and door start
for it while the next family's ``vllm serve`` starts (two engines alive at most). Two
processes fewer than the fleet layout, as each costs seconds of imports on every family:
upstream's render answers come from ``vllm serve --enable-scale-out``, which mounts the very
router ``vllm launch render`` serves (its ``/v1/chat/completions/render``;
``test_render_parity`` holds the dedicated server to the same rules), and our door renders
inline, render's own app in the door's process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tandem_client import TandemClient
from tools.servers import ServerProcess, serving, tandem_front, tandem_generate, upstream_serve
from tools.tiny_families import FAMILIES
from tools.tiny_models import ensure_model

from ..support.images import data_url, mp4_bytes, png_bytes
from ..support.openai_compare import LOGPROB_ABS, differences, whole
from ..support.render_compare import assert_same_request, post_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,
]

MODELS = ["qwen2.5-vl", *FAMILIES]
VIDEO = {"qwen2.5-vl"} | {name for name, f in FAMILIES.items() if "video" in f.modalities}

# Where upstream's render route itself refuses what vllm serve's chat answers (see the render
# test).
UPSTREAM_RENDER_REFUSES = {("gemma3", "two images")}

# Enough tokens for a wrong logit to show, few enough to keep each case under a second.
MAX_TOKENS = 8


def _image(width: int, height: int, seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(png_bytes(width, height, seed))}}


def _user(*parts: dict[str, Any], text: str) -> dict[str, Any]:
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


CASES: dict[str, list[dict[str, Any]]] = {
    "text": [{"role": "user", "content": "Write one line about the sea."}],
    "one image": [_user(_image(448, 448, 1), text="What is in this image?")],
    "two images": [_user(_image(448, 448, 2), _image(320, 240, 3), text="Compare them.")],
    "earlier turn": [
        _user(_image(448, 448, 4), text="What is this?"),
        {"role": "assistant", "content": "A picture of noise."},
        {"role": "user", "content": "Say more about it."},
    ],
    "video": [
        _user(
            {"type": "video_url", "video_url": {"url": data_url(mp4_bytes(), "video/mp4")}},
            text="What happens?",
        )
    ],
}


def cases_of(model: str) -> list[str]:
    return [c for c in CASES if c != "video" or model in VIDEO]


def chat_request(model_dir: str, case: str) -> dict[str, Any]:
    """The greedy chat a case sends, every route the same fields."""
    return {
        "model": model_dir,
        "messages": CASES[case],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": 2,
    }


@dataclass
class Reference:
    """What vLLM's own servers answered for each case of one family."""

    name: str
    model_dir: str
    chats: dict[str, dict[str, Any]]
    """``vllm serve``'s whole chat answers (tokens as ``token_id:N``)."""
    renders: dict[str, httpx.Response]
    """Upstream render's chat render answers (``vllm serve``'s scale-out route)."""


@pytest.fixture(scope="module")
def upstream_ahead(request) -> Iterator[dict[str, ServerProcess]]:
    """``vllm serve`` of the family after the one being tested, started while ours start (an
    engine's start-up is a chain of single-threaded imports: two overlap on two cores at
    little cost); any left unused are stopped when the module ends."""
    started: dict[str, ServerProcess] = {}
    try:
        yield started
    finally:
        for proc in started.values():
            proc.stop()


def _selected_families(request) -> list[str]:
    """This module's families in the order their tests run (``-k`` may select a few)."""
    names = (
        item.callspec.params.get("reference")
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    )
    return list(dict.fromkeys(name for name in names if name is not None))


def _start_next_upstream(request, name: str, started: dict[str, ServerProcess]) -> None:
    families = _selected_families(request)
    later = families[families.index(name) + 1 :] if name in families else []
    if later and later[0] not in started:
        started[later[0]] = upstream_serve(str(ensure_model(later[0])))


@pytest.fixture(scope="module", params=MODELS)
def reference(request, upstream_ahead: dict[str, ServerProcess]) -> Reference:
    name: str = request.param
    model_dir = str(ensure_model(name))
    serve = upstream_ahead.pop(name, None) or upstream_serve(model_dir)
    with serving([serve], timeout=300):
        chats, renders = {}, {}
        for case in cases_of(name):
            body = chat_request(model_dir, case)
            chats[case] = whole(serve.url, True, **body, extra_body=_token_ids())
            renders[case] = httpx.post(
                serve.url + "/v1/chat/completions/render", json=body, timeout=120
            )
    _start_next_upstream(request, name, upstream_ahead)
    return Reference(name, model_dir, chats, renders)


def _token_ids() -> dict[str, Any]:
    return {"return_tokens_as_token_ids": True}


@dataclass
class Pair:
    generate: str
    door: str
    """Also the render URL: the door passes render's routes to the render app it hosts."""


@pytest.fixture(scope="module")
def pair(reference: Reference) -> Iterator[Pair]:
    """Our generate and a door rendering inline, for the family ``reference`` answered (its
    engine gone). Both start at once: the door's imports run while the engine starts, and its
    /health answers once generate's does."""
    generate = tandem_generate(reference.model_dir)
    door = tandem_front(reference.model_dir, "inline", generate.url)
    with serving([generate, door], timeout=300):
        yield Pair(generate.url, door.url)


def _case(reference: Reference, case: str) -> None:
    if case not in reference.chats:
        pytest.skip(f"{reference.name} takes no video")


@pytest.mark.parametrize("case", list(CASES))
def test_door_answers_as_vllm_serve(reference: Reference, pair: Pair, case: str) -> None:
    _case(reference, case)
    body = chat_request(reference.model_dir, case)
    ours = whole(pair.door, True, **body, extra_body=_token_ids())
    assert differences(ours, reference.chats[case]) == []


@pytest.mark.parametrize("case", list(CASES))
def test_client_answers_as_vllm_serve(reference: Reference, pair: Pair, case: str) -> None:
    _case(reference, case)
    body = chat_request(reference.model_dir, case)
    with TandemClient(pair.door, pair.generate) as client:
        request = client.render_chat(body.pop("messages"), **body)
        answer = client.generate(request)
    theirs = reference.chats[case]
    assert len(request.token_ids) == theirs["usage"]["prompt_tokens"]
    (choice,) = answer.choices
    expected = [_token_id(t["token"]) for t in theirs["choices"][0]["logprobs"]["content"]]
    assert choice.token_ids == expected
    assert choice.logprobs is not None and choice.logprobs.content is not None
    for mine, their in zip(
        choice.logprobs.content, theirs["choices"][0]["logprobs"]["content"], strict=True
    ):
        assert mine.logprob == pytest.approx(their["logprob"], abs=LOGPROB_ABS)
        assert [t.token_id for t in mine.top_logprobs] == [
            _token_id(t["token"]) for t in their["top_logprobs"]
        ]


def _token_id(token: str) -> int:
    """``vllm serve``'s ``return_tokens_as_token_ids`` form, ``token_id:N``."""
    return int(token.removeprefix("token_id:"))


@pytest.mark.parametrize("case", list(CASES))
def test_render_answers_as_upstream_render(reference: Reference, pair: Pair, case: str) -> None:
    _case(reference, case)
    body = chat_request(reference.model_dir, case)
    mine = post_json(pair.door, "/v1/chat/completions/render", body)
    theirs = reference.renders[case]
    if (reference.name, case) in UPSTREAM_RENDER_REFUSES:
        # Upstream's render route (vllm launch render's router) checks its own answer with
        # upstream generate's rule that ranges never overlap, which the model's processor
        # breaks here (placeholders sharing a token no image embeds); vllm serve's chat answers
        # the same chat, and so do we.
        assert theirs.status_code == 400, theirs.text[:500]
        assert "non-overlapping" in theirs.text
        assert len(mine["token_ids"]) == reference.chats[case]["usage"]["prompt_tokens"]
        return
    assert theirs.status_code == 200, theirs.text[:2000]
    assert_same_request(mine, theirs.json(), reference.model_dir)
