"""The `openai` SDK (as released) against the front door and against `vllm serve` on the same
model and engine options: the same requests, greedy or seeded, answer field for field the same,
whole and streamed (streams merged per choice, and the chunk sequences' shapes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tools.servers import tandem_front

from ..support.images import data_url, png_bytes
from ..support.openai_compare import (
    DONE,
    answers,
    choices_of,
    fingerprints,
    streamed,
    warm,
    whole,
)

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

MAX_MODEL_LEN = 4096  # tools/servers.py starts every engine with this context
EOS, ENDOFTEXT = 1018, 1016  # the tiny Qwen2-VL's <|im_end|> (its EOS) and <|endoftext|>

STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@pytest.fixture(scope="module")
def inline_door(fleet_servers) -> Iterator[str]:
    """A door at its defaults rendering in its own process (``--render inline``) over our
    first generate node; stopped when the module ends."""
    model, procs = fleet_servers
    with tandem_front(model, "inline", procs["generate"].url, workers=None) as proc:
        proc.wait_healthy(timeout=120)
        yield proc.url


@pytest.fixture(params=["render service", "render inline"])
def urls(request, fleet) -> tuple[str, str, str]:
    """The model, the door's URL (over the render service, or rendering inline) and vllm
    serve's."""
    model, fleet_urls = fleet
    if request.param == "render service":
        door = request.getfixturevalue("front_door")[0]
    else:
        door = request.getfixturevalue("inline_door")
    return model, door, fleet_urls["up_serve"]


def usage_options(stream: bool, continuous: bool = True) -> dict[str, Any]:
    if not stream:
        return {}
    return {"stream_options": {"include_usage": True, "continuous_usage_stats": continuous}}


def image_messages(seed: int, text: str = "Describe.") -> list[dict[str, Any]]:
    image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(seed=seed))}}
    return [{"role": "user", "content": [image, {"type": "text", "text": text}]}]


def text_messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@STREAM
def test_chat_with_an_image_greedy_logprobs_token_ids_usage(urls, stream):
    model, door, serve = urls
    _, theirs = answers(
        door,
        serve,
        True,
        stream,
        model=model,
        messages=image_messages(61),
        temperature=0.0,
        max_completion_tokens=10,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
        **usage_options(stream),
    )
    (choice,) = choices_of(theirs, True)
    assert len(choice["token_ids"]) == 10 and choice["finish_reason"] == "length"
    assert all(len(p["top_logprobs"]) == 3 for p in choice["logprobs"])
    if stream:  # the stream's frame, on vllm serve as on the door (checked equal above)
        assert theirs[-1] == DONE and theirs[-2]["usage"]["completion_tokens"] == 10


@STREAM
def test_chat_n_with_a_seed(urls, stream):
    # vLLM refuses n > 1 under greedy sampling: a seed makes the samples comparable instead.
    model, door, serve = urls
    request = {"model": model, "messages": image_messages(62)}
    warm(door, serve, True, **request)
    _, theirs = answers(
        door,
        serve,
        True,
        stream,
        **request,
        n=3,
        temperature=1.0,
        seed=1234,
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
        **usage_options(stream, continuous=False),
    )
    samples = [c["token_ids"] for c in choices_of(theirs, True)]
    assert len(samples) == 3 and len({tuple(s) for s in samples}) > 1  # sampled, not greedy


def stop_case(model: str, serve: str) -> tuple[dict[str, Any], str, list[int], int]:
    """A greedy chat request, a stop string from the middle of its text, its token ids, and
    a position >= 3 whose token is sampled there first (a stop token that cuts it short)."""
    base = {
        "model": model,
        "messages": text_messages("Tell me a story about a fox."),
        "temperature": 0.0,
        "max_tokens": 16,
    }
    doc = whole(serve, True, **base, extra_body={"return_token_ids": True})
    (choice,) = doc["choices"]
    ids = choice["token_ids"]
    k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])
    return base, choice["message"]["content"][6:8], ids, k


@STREAM
def test_chat_stop_strings_include_stop_str_min_tokens(urls, stream):
    model, door, serve = urls
    base, stop, ids, _ = stop_case(model, serve)
    for include in (False, True):
        _, theirs = answers(
            door,
            serve,
            True,
            stream,
            **base,
            stop=[stop],
            extra_body={"include_stop_str_in_output": include, "return_token_ids": True},
            **usage_options(stream),
        )
        (choice,) = choices_of(theirs, True)
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    # min_tokens holds the stop string back for the first tokens.
    _, theirs = answers(
        door,
        serve,
        True,
        stream,
        **base,
        stop=[stop],
        extra_body={"min_tokens": 12, "return_token_ids": True},
        **usage_options(stream),
    )
    (choice,) = choices_of(theirs, True)
    assert len(choice["token_ids"]) >= 12


@STREAM
def test_chat_stop_token_ids_min_tokens(urls, stream):
    model, door, serve = urls
    base, _, ids, k = stop_case(model, serve)
    _, theirs = answers(
        door,
        serve,
        True,
        stream,
        **base,
        extra_body={"stop_token_ids": [ids[k]], "return_token_ids": True},
        **usage_options(stream),
    )
    (choice,) = choices_of(theirs, True)
    assert choice["stop_reason"] == ids[k] and choice["token_ids"] == ids[: k + 1]
    # min_tokens masks the stop token for the first tokens: the answer changes course.
    _, theirs = answers(
        door,
        serve,
        True,
        stream,
        **base,
        extra_body={"stop_token_ids": [ids[k]], "min_tokens": 12, "return_token_ids": True},
        **usage_options(stream),
    )
    (choice,) = choices_of(theirs, True)
    assert len(choice["token_ids"]) >= 12


@STREAM
def test_eos_ignore_eos_and_special_tokens(urls, stream):
    """A logit bias makes the tiny model say EOS (or <|endoftext|>, the generation config's
    other EOS) at once: where it stops, what ignore_eos and skip_special_tokens change."""
    model, door, serve = urls
    base = {"model": model, "messages": text_messages("hi"), "max_tokens": 4, "temperature": 0.0}
    cases = [
        # (bias towards, more fields, (finish_reason, stop_reason, tokens) on vllm serve)
        (EOS, {}, ("stop", None, 1)),
        (ENDOFTEXT, {}, ("stop", ENDOFTEXT, 1)),
        (ENDOFTEXT, {"ignore_eos": True}, ("length", None, 4)),
        (ENDOFTEXT, {"ignore_eos": True, "skip_special_tokens": False}, ("length", None, 4)),
        (EOS, {"ignore_eos": True, "skip_special_tokens": False}, ("length", None, 4)),
    ]
    for token, fields, expected in cases:
        _, theirs = answers(
            door,
            serve,
            True,
            stream,
            **base,
            logit_bias={str(token): 100},
            extra_body={**fields, "return_token_ids": True},
            **usage_options(stream),
        )
        (choice,) = choices_of(theirs, True)
        got = (choice["finish_reason"], choice["stop_reason"], len(choice["token_ids"]))
        assert got == expected, (token, fields)
        special = "<|im_end|>" if token == EOS else "<|endoftext|>"
        assert (special in choice["text"]) is (fields.get("skip_special_tokens") is False)


@pytest.mark.xfail(
    # Not strict: it fails on AVX2 machines (CI on 2026-11-28, and after) and passes on
    # AVX-512 ones (2026-12-06, all four cases), whose kernels rank that candidate otherwise.
    strict=False,
    reason=(
        "open (first failed in CI on 2026-11-28, on AVX2 machines): the door's answer "
        "names one candidate at the last position (token 159, a byte-fallback piece vllm serve "
        "writes as '') ' start'; the tokens, the sampled texts and every other logprob agree"
    ),
)
@STREAM
def test_completions_several_prompts_n_seed_logprobs_k(urls, stream):
    """Completions' ``logprobs=k`` lists k+1 candidates where the sampled token is not among
    the top k (sampled at temperature 1, that happens on this model)."""
    model, door, serve = urls
    k = 2
    _, theirs = answers(
        door,
        serve,
        False,
        stream,
        model=model,
        prompt=["The quick brown", "Once upon a time"],
        n=2,
        temperature=1.0,
        seed=99,
        max_tokens=8,
        logprobs=k,
        extra_body={"return_token_ids": True},
        **usage_options(stream),
    )
    choices = choices_of(theirs, False)
    assert len(choices) == 4
    counts = {len(p["top_logprobs"]) for c in choices for p in c["logprobs"]}
    assert k + 1 in counts, counts


@STREAM
def test_completions_stop_strings(urls, stream):
    model, door, serve = urls
    base = {"model": model, "prompt": ["Once upon a time", "The"], "temperature": 0.0}
    doc = whole(serve, False, **base, max_tokens=12)
    stops = [c["text"][4:6] for c in doc["choices"]]
    for include in (False, True):
        answers(
            door,
            serve,
            False,
            stream,
            **base,
            max_tokens=12,
            stop=stops,
            logprobs=1,
            extra_body={"include_stop_str_in_output": include, "return_token_ids": True},
            **usage_options(stream),
        )


@STREAM
def test_max_tokens_past_the_room_left_is_clamped(urls, stream):
    model, door, serve = urls
    room = 5
    _, theirs = answers(
        door,
        serve,
        False,
        stream,
        model=model,
        prompt=[100] * (MAX_MODEL_LEN - room),
        temperature=0.0,
        max_tokens=MAX_MODEL_LEN,
        extra_body={"return_token_ids": True},
        **usage_options(stream),
    )
    (choice,) = choices_of(theirs, False)
    assert len(choice["token_ids"]) == room and choice["finish_reason"] == "length"


def test_n_above_1_under_greedy_sampling_is_refused_alike(urls):
    """vLLM refuses n > 1 at temperature 0 (hence the seeds above): the same 400 and message
    from both (the error ``type`` is the project's vocabulary, shared/tandem_wire/error_types)."""
    import openai

    model, door, serve = urls
    refusals = []
    for url in (door, serve):
        with pytest.raises(openai.BadRequestError) as refused:
            whole(url, True, model=model, messages=text_messages("hi"), n=2, temperature=0.0)
        body = refused.value.body
        refusals.append((refused.value.status_code, isinstance(body, dict) and body["message"]))
    assert refusals[0] == refusals[1]


def test_system_fingerprint_as_vllm_serve_gives_it(urls):
    """vllm serve names its engine (``vllm-<version>-<config hash>``) on whole answers and on
    a stream's last chunk: the usage chunk if asked for, else each choice's finish chunk."""
    model, door, serve = urls
    chat = {"model": model, "messages": text_messages("hi"), "max_tokens": 3}
    completion = {"model": model, "prompt": "Once upon", "max_tokens": 3}
    usage = {"stream_options": {"include_usage": True}}
    asked = [
        (whole, True, chat),
        (streamed, True, chat),
        (streamed, True, {**chat, **usage}),
        (whole, False, completion),
        (streamed, False, {**completion, **usage}),
    ]
    for call, is_chat, request in asked:
        theirs = fingerprints(call(serve, is_chat, temperature=0.0, **request))
        assert theirs and all(theirs), (call.__name__, is_chat, request)
        ours = fingerprints(call(door, is_chat, temperature=0.0, **request))
        assert ours == theirs, (call.__name__, is_chat, request)
