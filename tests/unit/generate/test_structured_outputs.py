"""Structured outputs on generate: the constraint reaches the engine (greedy output from the tiny
random model parses and conforms), and hostile constraints are typed 400s after which the
engine keeps serving; the operator's size cap and off switch hold."""

from __future__ import annotations

import json
import re

import pytest

from tandem_wire import GenerateRequest, WireFormat, encode_generate_request, error_types

from ...support.asgi import app_client
from .helpers import generate_app, post, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

JSON = WireFormat.JSON
PROMPT = [1017, 359, 261, 198, 82, 1018, 198, 1017, 436, 198]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "size", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(qwen2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_dir)


@pytest.fixture(scope="module")
def no_whitespace(tokenizer) -> dict[str, float]:
    """A ``logit_bias`` against whitespace-only tokens. JSON grammars allow whitespace between
    tokens (vLLM turns that off only engine-wide, and not under the ``auto`` backend), and the
    random model, greedy, would write tabs until ``max_tokens``."""
    return {
        str(i): -100.0
        for i in range(len(tokenizer))
        if not tokenizer.decode([i]).strip() and tokenizer.decode([i])
    }


@pytest.fixture
async def client(qwen2_engine, qwen2_dir):
    async with app_client(generate_app(qwen2_engine, qwen2_dir)) as c:
        yield c


def request(
    structured: object, max_tokens: int = 64, *, stream: bool = False, **fields
) -> GenerateRequest:
    sampling = {"temperature": 0.0, "max_tokens": max_tokens, **fields}
    if structured is not None:
        sampling["structured_outputs"] = structured
    return GenerateRequest(token_ids=PROMPT, sampling_params=sampling, stream=stream)


async def text_of(client, tokenizer, structured: dict, **kw) -> str:
    answer = await post(client, request(structured, **kw))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop", choice  # the grammar ended it, not max_tokens
    return str(tokenizer.decode(tokens(answer), skip_special_tokens=True))


async def test_json_schema_output_parses_and_conforms(client, tokenizer, no_whitespace):
    import jsonschema

    unconstrained = await post(client, request(None, max_tokens=16))
    text = await text_of(client, tokenizer, {"json": SCHEMA}, logit_bias=no_whitespace)
    jsonschema.validate(json.loads(text), SCHEMA)
    # The random model alone writes no JSON: the constraint is what made this one.
    free = tokenizer.decode(tokens(unconstrained), skip_special_tokens=True)
    with pytest.raises(ValueError):
        json.loads(free)


async def test_json_schema_as_a_string_and_json_object(client, tokenizer, no_whitespace):
    text = await text_of(client, tokenizer, {"json": json.dumps(SCHEMA)}, logit_bias=no_whitespace)
    assert set(json.loads(text)) == {"name", "size", "ok"}
    text = await text_of(
        client, tokenizer, {"json_object": True}, max_tokens=256, logit_bias=no_whitespace
    )
    assert isinstance(json.loads(text), dict)


async def test_regex_choice_and_grammar_are_honoured(client, tokenizer):
    text = await text_of(client, tokenizer, {"regex": r"[a-c]{2,5}-[0-9]{3}"})
    assert re.fullmatch(r"[a-c]{2,5}-[0-9]{3}", text), text
    choices = ["red", "green", "blue"]
    assert await text_of(client, tokenizer, {"choice": choices}) in choices
    grammar = 'root ::= "yes" | "no" | "maybe " [0-9]'
    text = await text_of(client, tokenizer, {"grammar": grammar})
    assert re.fullmatch(r"yes|no|maybe [0-9]", text), text


async def test_a_stream_is_constrained_too(client, tokenizer):
    choices = ["alpha", "beta", "gamma"]
    req = request({"choice": choices}, stream=True)
    r = await client.post("/inference/v1/generate", content=encode_generate_request(req, JSON))
    assert r.status_code == 200, r.text[:500]
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: {")]
    ids = [t for e in events for c in json.loads(e)["choices"] for t in c["token_ids"] or []]
    assert tokenizer.decode(ids, skip_special_tokens=True) in choices


async def test_structured_outputs_turned_off_are_refused(qwen2_engine, qwen2_dir):
    async with app_client(generate_app(qwen2_engine, qwen2_dir, structured_outputs=False)) as c:
        err = await post(c, request({"choice": ["a", "b"]}), expect=400)
        assert err["error"]["type"] == error_types.STRUCTURED_OUTPUTS_DISABLED
        await post(c, request(None, max_tokens=2))  # the rest is served as before


async def test_the_size_cap_is_the_operators(qwen2_engine, qwen2_dir, tokenizer):
    choices = [f"option {i}" for i in range(8)]
    size = len(json.dumps({"choice": choices}, separators=(",", ":")))
    app = generate_app(qwen2_engine, qwen2_dir, max_structured_output_bytes=size)
    async with app_client(app) as c:
        answer = await post(c, request({"choice": choices}))
        assert tokenizer.decode(tokens(answer), skip_special_tokens=True) in choices
        err = await post(c, request({"choice": [*choices, "x"]}), expect=400)
        assert err["error"]["type"] == error_types.STRUCTURED_OUTPUT_TOO_LARGE


def _hostile() -> list[tuple[str, dict, str]]:
    enum = {"type": "string", "enum": [f"value-{i:05d}" for i in range(10_000)]}
    return [
        ("invalid schema", {"json": {"type": "nonsense"}}, error_types.INVALID_STRUCTURED_OUTPUT),
        ("schema not JSON", {"json": "{not json"}, error_types.INVALID_STRUCTURED_OUTPUT),
        (
            "recursive schema",
            {"json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}},
            error_types.INVALID_STRUCTURED_OUTPUT,
        ),
        ("huge regex", {"regex": "a" * 70_000}, error_types.STRUCTURED_OUTPUT_TOO_LARGE),
        (
            "pathological regex",
            {"regex": "(a{0,30}){0,30}(a{0,30}){0,30}"},
            error_types.INVALID_STRUCTURED_OUTPUT,
        ),
        ("10,000-entry enum", {"json": enum}, error_types.STRUCTURED_OUTPUT_TOO_LARGE),
        ("empty choice", {"choice": []}, error_types.INVALID_STRUCTURED_OUTPUT),
        ("two constraints", {"regex": "a", "choice": ["a"]}, error_types.INVALID_STRUCTURED_OUTPUT),
        ("no constraint", {}, error_types.INVALID_STRUCTURED_OUTPUT),
        (
            "bad grammar",
            {"grammar": "root ::= undefined_rule"},
            error_types.INVALID_STRUCTURED_OUTPUT,
        ),
        (
            "unknown field",
            {"regex": "a", "backend": "outlines"},
            error_types.INVALID_STRUCTURED_OUTPUT,
        ),
        ("not an object", "regex", error_types.INVALID_STRUCTURED_OUTPUT),
    ]


@pytest.mark.parametrize(
    ("name", "structured", "type_"), _hostile(), ids=lambda v: v if isinstance(v, str) else ""
)
async def test_hostile_constraints_are_typed_400s_and_the_engine_keeps_serving(
    client, qwen2_engine, name, structured, type_
):
    for stream in (False, True):
        err = await post(client, request(structured, stream=stream), expect=400)
        assert err["error"]["type"] == type_, err
        assert err["error"]["param"] == "sampling_params.structured_outputs"
    answer = await post(client, request({"choice": ["x", "y"]}, max_tokens=4))
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert not qwen2_engine.errored
