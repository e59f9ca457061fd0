"""What the engine receives is what the caller asked for, field by field, default values included.

Render leaves out sampling fields equal to vLLM's ``SamplingParams`` defaults, and an absent
``max_tokens`` means "the room left in the context" to a generate server (upstream's and ours),
not 16. These tests watch the engine's own input (the ``SamplingParams`` handed to vLLM's
``AsyncLLM.generate``) and the completions it produced.
"""

from __future__ import annotations

import msgspec
import pytest

from tandem_vllm.sampling import ALLOWED_FIELDS
from tandem_wire import GenerateRequest

from ...support.asgi import app_client
from ...support.images import png_bytes
from .helpers import client_stack, generate_app, post

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

IMAGE_PAD = 1022
# A user turn with one image, then the assistant turn (tiny Qwen2-VL token ids).
PROMPT = [1017, 359, 261, 198, 1019, IMAGE_PAD, 1020, 82, 1018, 198, 1017, 436, 198]


@pytest.fixture
def received(qwen2_engine, monkeypatch):
    """Every SamplingParams the engine is handed, in order."""
    seen = []
    original = qwen2_engine.llm.generate

    def spy(prompt, params, request_id, *args, **kwargs):
        seen.append(params.clone())
        return original(prompt, params, request_id, *args, **kwargs)

    monkeypatch.setattr(qwen2_engine.llm, "generate", spy)
    return seen


@pytest.fixture
async def client(qwen2_engine, qwen2_renderer, qwen2_dir, received):
    async with client_stack(qwen2_engine, qwen2_renderer, qwen2_dir) as c:
        yield c


def image_chat(seed: int) -> list[dict]:
    image = {"type": "image", "image": png_bytes(seed=seed)}
    return [{"role": "user", "content": [image, {"type": "text", "text": "Describe."}]}]


@pytest.mark.parametrize("max_tokens", [16, 4, 17])
async def test_rollout_max_tokens_reach_the_engine(client, received, max_tokens):
    out = await client.rollout(
        [PROMPT, PROMPT],
        [[png_bytes(seed=1)], [png_bytes(seed=2)]],
        n=2,
        temperature=1.0,
        max_tokens=max_tokens,
        progress=False,
    )
    assert [p.max_tokens for p in received] == [max_tokens, max_tokens]
    assert len(out.completion_ids) == 4
    assert all(1 <= len(c) <= max_tokens for c in out.completion_ids)


# (field, value): each SamplingParams default, and a value that is not one.
ROLLOUT_FIELDS = [
    ("n", 1),
    ("n", 2),
    ("temperature", 1.0),
    ("temperature", 0.7),
    ("top_p", 1.0),
    ("top_p", 0.9),
    ("top_k", 0),
    ("top_k", 5),
    ("min_p", 0.0),
    ("min_p", 0.05),
    ("repetition_penalty", 1.0),
    ("repetition_penalty", 1.2),
    ("logprobs", 0),
    ("logprobs", 2),
    ("seed", 0),
    ("seed", 7),
]


@pytest.mark.parametrize(("field", "value"), ROLLOUT_FIELDS)
async def test_rollout_fields_reach_the_engine_as_asked(client, received, field, value):
    fields = {"temperature": 1.0, "max_tokens": 2, field: value}
    await client.rollout([PROMPT], [[png_bytes(seed=3)]], progress=False, **fields)
    assert len(received) == 1
    assert getattr(received[0], field) == value
    assert received[0].max_tokens == 2


# (chat field, value, SamplingParams field, what the engine must get)
CHAT_FIELDS = [
    ("max_tokens", 16, "max_tokens", 16),
    ("max_tokens", 17, "max_tokens", 17),
    ("max_completion_tokens", 16, "max_tokens", 16),
    ("min_tokens", 0, "min_tokens", 0),
    ("min_tokens", 2, "min_tokens", 2),
    ("temperature", 1.0, "temperature", 1.0),
    ("top_p", 1.0, "top_p", 1.0),
    ("top_k", 0, "top_k", 0),
    ("n", 1, "n", 1),
    ("n", 2, "n", 2),
    ("seed", 7, "seed", 7),
    ("stop", [], "stop", []),
    ("stop", "xyz", "stop", ["xyz"]),
    ("presence_penalty", 0.0, "presence_penalty", 0.0),
    ("presence_penalty", 0.5, "presence_penalty", 0.5),
    ("frequency_penalty", 0.0, "frequency_penalty", 0.0),
    ("repetition_penalty", 1.0, "repetition_penalty", 1.0),
    ("ignore_eos", False, "ignore_eos", False),
    ("ignore_eos", True, "ignore_eos", True),
    # Render writes vLLM's private derived fields for these (_all_stop_token_ids, ...).
    ("stop_token_ids", [5], "stop_token_ids", [5]),
    ("bad_words", ["hello"], "bad_words", ["hello"]),
]


@pytest.mark.parametrize(("field", "value", "param", "expected"), CHAT_FIELDS)
async def test_chat_fields_reach_the_engine_as_asked(
    client, received, field, value, param, expected
):
    fields = {"max_tokens": 2, field: value}
    await client.chat(image_chat(4), **fields)
    assert len(received) == 1
    assert getattr(received[0], param) == expected


async def test_chat_logprobs_reach_the_engine(client, received):
    await client.chat(image_chat(5), max_tokens=2, logprobs=True, top_logprobs=0)
    assert received[0].logprobs == 0


def long_chat(words: int) -> list[dict]:
    text = {"type": "text", "text": "hi " * words}
    return [{"role": "user", "content": [image_chat(8)[0]["content"][0], text]}]


async def test_max_tokens_beyond_the_room_left_is_clamped_as_vllm_serve_does(
    client, received, qwen2_engine
):
    # vLLM's own to_sampling_params (in render) clamps max_tokens to the room the prompt
    # leaves; a client that wrote the caller's value back would get generate's 400.
    limit = qwen2_engine.max_model_len
    too_many = limit  # vLLM refuses more than the context; up to it, clamps to the room left
    # Prompts that leave a few tokens of room (the clamp is then fast to generate to).
    short, longer = [len((await client.render_chat(long_chat(k))).token_ids) for k in (1, 101)]
    words = 1 + (limit - 6 - short) * 100 // (longer - short)
    prompt = (await client.render_chat(long_chat(words))).token_ids
    image_len = len(
        (await client.render_completion([PROMPT], images=[[png_bytes(seed=9)]]))[0].token_ids
    )
    ids = PROMPT[:-5] + [100] * (limit - 6 - image_len) + PROMPT[-5:]
    assert 0 < limit - len(prompt) <= 32

    answer = await client.chat(long_chat(words), max_tokens=too_many)
    out = await client.rollout([ids], [[png_bytes(seed=9)]], max_tokens=too_many, progress=False)
    assert answer.choices and out.completion_ids
    assert [p.max_tokens for p in received] == [
        limit - len(prompt),
        limit - len(out.prompt_ids[0]),
    ]


async def test_chat_with_max_tokens_16_generates_16(client):
    answer = await client.chat(image_chat(6), max_tokens=16, ignore_eos=True, n=2)
    assert [len(c.token_ids or []) for c in answer.choices] == [16, 16]


async def test_absent_fields_mean_what_they_mean_upstream(qwen2_engine, qwen2_dir, received):
    """An absent ``max_tokens`` is the room left in the context (as upstream's generate reads
    it); every other absent field is vLLM's SamplingParams default."""
    room = 6
    prompt = [100] * (qwen2_engine.max_model_len - room)
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        await post(c, GenerateRequest(token_ids=prompt, sampling_params={}))
        answer = await post(c, GenerateRequest(token_ids=prompt, sampling_params={"max_tokens": 3}))
    defaults = msgspec.convert({}, type(received[0]))
    assert received[0].max_tokens == room
    # detokenize: the server's own choice (see the next test), invisible in token answers.
    for name in sorted(ALLOWED_FIELDS - {"max_tokens", "detokenize"}):
        assert getattr(received[0], name) == getattr(defaults, name), name
    assert received[1].max_tokens == 3 and len(answer["choices"][0]["token_ids"]) <= 3


@pytest.mark.parametrize(
    ("fields", "detokenize"),
    [({}, False), ({"detokenize": True}, False), ({"stop": ["xyz"]}, True)],
)
async def test_the_engine_detokenizes_only_for_stop_strings(
    qwen2_engine, qwen2_dir, received, fields, detokenize
):
    """Answers carry token ids only: text is decoded just where stop strings must match it."""
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        params = {"max_tokens": 2, **fields}
        await post(c, GenerateRequest(token_ids=[100] * 8, sampling_params=params))
    assert received[0].detokenize is detokenize


async def test_an_explicit_null_max_tokens_fills_the_context(qwen2_engine, qwen2_dir, received):
    room = 4
    prompt = [100] * (qwen2_engine.max_model_len - room)
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        await post(c, GenerateRequest(token_ids=prompt, sampling_params={"max_tokens": None}))
    assert received[0].max_tokens == room
