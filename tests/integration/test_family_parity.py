"""Every model family users bring, answered as vLLM answers it.

For each family's tiny checkpoint (``tools.tiny_families``; Qwen2.5-VL beside them, Qwen2-VL,
Qwen3-VL and Qwen2-Audio have suites of their own), and each chat a user sends (text only, one
image, two images of different sizes, an image in an earlier turn, a video, two videos, an
audio clip):

- the door's OpenAI answer equals ``vllm serve``'s, field for field (prompt tokens, tokens,
  logprobs);
- ``tandem_client``'s render -> generate gives ``vllm serve``'s prompt length, tokens and
  logprobs;
- render's answer equals upstream render's, field for field (``test_render_parity``'s
  rules).

Where ``vllm serve`` refuses a chat (media the model does not take, more items than it takes),
the door, the client and render refuse it the same way: status, ``type`` and ``param``.

``make test`` runs the families marked ``in_make_test`` (one of each kind at least);
``make test-families`` (``TANDEM_ALL_FAMILIES=1``) runs every family.

``vllm serve`` answers every case of a family and stops, then our generate and door start
for it while the next family's ``vllm serve`` starts (two engines alive at most). Two
processes fewer than the fleet layout, as each costs seconds of imports on every family:
upstream's render answers come from ``vllm serve --enable-scale-out``, which mounts the very
router ``vllm launch render`` serves (its ``/v1/chat/completions/render``;
``test_render_parity`` holds the dedicated server to the same rules), and our door renders
inline, render's own app in the door's process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tandem_client import ServiceError, TandemClient
from tools.servers import ServerProcess, serving, tandem_front, tandem_generate, upstream_serve
from tools.tiny_families import FAMILIES
from tools.tiny_models import ensure_model

from ..support.audio import audio_bytes, input_audio_part
from ..support.images import data_url, mp4_bytes, png_bytes
from ..support.openai_compare import LOGPROB_ABS, differences, whole
from ..support.render_compare import assert_same_request, post_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,
]

ALL_FAMILIES = os.environ.get("TANDEM_ALL_FAMILIES") == "1"
"""``make test-families``: every family, not only those ``make test`` runs."""
MODELS = ["qwen2.5-vl", *(name for name, f in FAMILIES.items() if ALL_FAMILIES or f.in_make_test)]

# Where upstream's render route itself refuses what vllm serve's chat answers (see the render
# test).
UPSTREAM_RENDER_REFUSES = {("gemma3", "two images"), ("gemma3n", "two images")}

# Where vllm serve itself fails a chat on the tiny checkpoint (no answer to compare with): not
# sent, and its tests skip with the reason.
UPSTREAM_FAILS = {
    ("gemma4", "audio"): (
        "vLLM CPU's onednn_mm refuses the audio tower's transposed lconv1d input "
        "(a.stride(-1) == 1), whatever the checkpoint"
    ),
}

# Enough tokens for a wrong logit to show, few enough to keep each case under a second.
MAX_TOKENS = 8


def _image(width: int, height: int, seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(png_bytes(width, height, seed))}}


def _user(*parts: dict[str, Any], text: str) -> dict[str, Any]:
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def _video(seed: int) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": data_url(mp4_bytes(seed=seed), "video/mp4")}}


CASES: dict[str, list[dict[str, Any]]] = {
    "text": [{"role": "user", "content": "Write one line about the sea."}],
    "one image": [_user(_image(448, 448, 1), text="What is in this image?")],
    "two images": [_user(_image(448, 448, 2), _image(320, 240, 3), text="Compare them.")],
    "earlier turn": [
        _user(_image(448, 448, 4), text="What is this?"),
        {"role": "assistant", "content": "A picture of noise."},
        {"role": "user", "content": "Say more about it."},
    ],
    "video": [_user(_video(0), text="What happens?")],
    "two videos": [_user(_video(0), _video(1), text="What differs?")],
    "audio": [_user(input_audio_part(audio_bytes(1.0, seed=1)), text="What is this sound?")],
}


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
    """``vllm serve``'s whole chat answers (tokens as ``token_id:N``), or for a chat it
    refused, its refusal (``_answer``)."""
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
        for case in CASES:
            if (name, case) in UPSTREAM_FAILS:
                continue
            body = chat_request(model_dir, case)
            chats[case] = _answer(serve.url, body)
            renders[case] = httpx.post(
                serve.url + "/v1/chat/completions/render", json=body, timeout=120
            )
    _start_next_upstream(request, name, upstream_ahead)
    return Reference(name, model_dir, chats, renders)


def _token_ids() -> dict[str, Any]:
    return {"return_tokens_as_token_ids": True}


def _answer(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The whole chat answer, or for a refusal ``{"refused": (status, type, param)}``."""
    try:
        return whole(url, True, **body, extra_body=_token_ids())
    except openai.APIStatusError as refused:
        return {"refused": _refusal(refused.status_code, refused.response.json())}


def _refusal(status: int, document: Any) -> tuple[int, Any, Any]:
    """What a client acts on in a refusal: its status, ``type`` and ``param``."""
    error = document.get("error") if isinstance(document, dict) else None
    error = error if isinstance(error, dict) else {}
    return status, error.get("type"), error.get("param")


def _skip_what_upstream_fails(reference: Reference, case: str) -> None:
    if (reference.name, case) in UPSTREAM_FAILS:
        pytest.skip(UPSTREAM_FAILS[reference.name, case])


def _refused(reference: Reference, case: str) -> tuple[int, Any, Any] | None:
    """``vllm serve``'s refusal of ``case``, None if it answered."""
    refused: tuple[int, Any, Any] | None = reference.chats[case].get("refused")
    return refused


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


@pytest.mark.parametrize("case", list(CASES))
def test_door_answers_as_vllm_serve(reference: Reference, pair: Pair, case: str) -> None:
    _skip_what_upstream_fails(reference, case)
    body = chat_request(reference.model_dir, case)
    ours = _answer(pair.door, body)
    assert differences(ours, reference.chats[case]) == []


@pytest.mark.parametrize("case", list(CASES))
def test_client_answers_as_vllm_serve(reference: Reference, pair: Pair, case: str) -> None:
    _skip_what_upstream_fails(reference, case)
    body = chat_request(reference.model_dir, case)
    refused = _refused(reference, case)
    with TandemClient(pair.door, pair.generate) as client:
        if refused is not None:
            with pytest.raises(ServiceError) as ours:
                client.render_chat(body.pop("messages"), **body)
            assert (ours.value.status_code, ours.value.type) == refused[:2]
            return
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
    _skip_what_upstream_fails(reference, case)
    body = chat_request(reference.model_dir, case)
    theirs = reference.renders[case]
    if _refused(reference, case) is not None:
        ours = httpx.post(pair.door + "/v1/chat/completions/render", json=body, timeout=120)
        assert _refusal(ours.status_code, ours.json()) == _refusal(
            theirs.status_code, theirs.json()
        )
        return
    mine = post_json(pair.door, "/v1/chat/completions/render", body)
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
