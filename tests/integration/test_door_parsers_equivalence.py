"""The front door answers what `vllm serve` answers, through the `openai` SDK as released: tool
calls (auto, required, named; a Responses API function call), reasoning, response_format,
structured outputs, echo with logprobs, prompt logprobs and completions' logprobs=k, whole and
streamed, on the tiny Qwen2-VL whose tokenizer holds hermes tool-call and deepseek_r1
reasoning markup.

Both sides run with the same parser options and seeded greedy engines: the hermes tool parser
for most tests, and ``PARSER_FLAGS`` (hermes and deepseek_r1) for reasoning. Two fleets, one
after the other: with deepseek_r1 on, vLLM applies structured outputs only once ``</think>`` is
generated, which the tiny random model never does (and its embedding table has no row for the
markup tokens, so no prompt may hold them either).
Left out of every comparison, as they differ between any two servers or calls: ``id`` (a
fresh request id), ``created`` (the clock), ``system_fingerprint`` (a hash of the server's
whole engine configuration; the door has none) and tool-call ids (random)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tools.servers import serving, tandem_front, tandem_generate, tandem_render, upstream_serve

from ..support.openai_compare import carries_output
from ..support.parser_model import PARSER_FLAGS, parser_model

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.own_fleet]

VARYING = {"id", "created", "system_fingerprint"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_FLAGS = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
GREEDY = {"temperature": 0.0, "seed": 0}


def _fleet(model_root: Any, flags: tuple[str, ...]) -> Any:
    """`vllm serve` and ours (render + generate + the door), both with ``flags``: the model
    folder and an ``openai.OpenAI`` client of each (a generator: stops them after)."""
    import openai

    model = str(parser_model(model_root))
    procs = [upstream_serve(model, *flags), tandem_render(model, *flags), tandem_generate(model)]
    # The door starts with the rest: its /health answers once render's and generate's do.
    door = tandem_front(model, procs[1].url, procs[2].url, *flags)
    with serving([*procs, door], timeout=300):
        clients = [
            openai.OpenAI(base_url=p.url + "/v1", api_key="none", max_retries=0, timeout=120)
            for p in (procs[0], door)
        ]
        yield model, clients[0], clients[1]


@pytest.fixture(scope="class")
def sides(tmp_path_factory):
    yield from _fleet(tmp_path_factory.mktemp("models"), TOOL_FLAGS)


@pytest.fixture(scope="class")
def reasoning_sides(tmp_path_factory):
    yield from _fleet(tmp_path_factory.mktemp("models"), PARSER_FLAGS)


# -- comparing ---------------------------------------------------------------------------------


def scrub(obj: Any) -> Any:
    """``obj`` without what differs between any two calls (see the module's docstring)."""
    if isinstance(obj, dict):
        out = {k: scrub(v) for k, v in obj.items() if k not in VARYING}
        if "function" in obj and "id" in obj:  # a tool call: its id is random
            out.pop("id", None)
        return out
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


# vLLM's own request fields: the SDK sends them in ``extra_body``.
VLLM_FIELDS = {"add_generation_prompt", "continue_final_message", "structured_outputs"}
VLLM_FIELDS |= {"skip_special_tokens", "prompt_logprobs"}


def sdk_call(client: Any, kind: str, body: dict[str, Any], **more: Any) -> Any:
    api = client.chat.completions if kind == "chat" else client.completions
    extra = {k: v for k, v in body.items() if k in VLLM_FIELDS}
    given = {k: v for k, v in body.items() if k not in VLLM_FIELDS}
    if extra:
        given["extra_body"] = extra
    return api.create(**given, **more)


def whole(client: Any, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return scrub(sdk_call(client, kind, body).model_dump())


def streamed(client: Any, kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [scrub(c.model_dump()) for c in sdk_call(client, kind, body, stream=True)]


def shape(chunks: list[dict[str, Any]]) -> list[str]:
    """The chunk sequence as kinds (runs collapsed): role, delta, finish, usage. A finish chunk
    that carries output counts as a delta and then the finish: how many tokens one chunk
    carries follows the machine's load, on vllm serve as on the door, and under load the last
    tokens and the finish come in one engine output."""
    kinds: list[str] = []
    for c in chunks:
        if not c["choices"]:
            found = ["usage"]
        elif c["choices"][0].get("finish_reason"):
            choice = c["choices"][0]
            carries = carries_output(choice, chat="delta" in choice)
            found = ["delta", "finish"] if carries else ["finish"]
        elif (c["choices"][0].get("delta") or {}).get("role"):
            found = ["role"]
        else:
            found = ["delta"]
        for kind in found:
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
    return kinds


_COMPLETION_LOGPROBS = ("text_offset", "token_logprobs", "tokens", "top_logprobs")


def merged(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each choice's streamed deltas put together (text, reasoning, tool calls, logprobs)."""
    out: dict[int, dict[str, Any]] = {}
    for c in chunks:
        for ch in c["choices"]:
            m = out.setdefault(ch["index"], {"text": "", "reasoning": "", "calls": {}, "lp": []})
            delta = ch.get("delta") or {}
            m["text"] += ch.get("text") or delta.get("content") or ""
            m["reasoning"] += delta.get("reasoning") or delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or ():
                call = m["calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            # Per position, not per chunk: how many tokens one chunk carries varies with load,
            # on vllm serve as on the door.
            lp = ch.get("logprobs")
            if lp and "content" in lp:
                m["lp"].extend(lp["content"] or [])
            elif lp:
                fields = [k for k in _COMPLETION_LOGPROBS if lp.get(k) is not None]
                for i in range(len(lp.get("tokens") or [])):
                    m["lp"].append({k: lp[k][i] for k in fields})
            if ch.get("finish_reason"):
                m["finish_reason"] = ch["finish_reason"]
    return out


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where two answers differ, as paths with both values (for a readable failure)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [
            d
            for k in sorted(set(ours) | set(theirs), key=str)
            for d in differences(ours.get(k), theirs.get(k), f"{path}.{k}")
        ]
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [
            d
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if ours == theirs else [f"{path}: ours {ours!r} theirs {theirs!r}"]


def tie_blind(answer: dict[str, Any]) -> dict[str, Any]:
    """Completions' candidates as their logprobs only: the door asks the engine for one more
    candidate, and among candidates of equal logprob (common in the tiny random model) a
    top-(k+1) may keep another token than a top-k does."""
    for choice in answer["choices"]:
        lp = choice.get("logprobs") or {}
        if lp.get("top_logprobs"):
            lp["top_logprobs"] = [t and sorted(t.values()) for t in lp["top_logprobs"]]
    return answer


def same(
    sides: Any, kind: str, body: dict[str, Any], ties: bool = False
) -> tuple[dict[str, Any], Any]:
    """Both sides' whole answers and merged streams, asserted equal; ours returned."""
    model, upstream, door = sides
    body = {"model": model, **body}
    theirs, ours = whole(upstream, kind, body), whole(door, kind, body)
    if ties:
        theirs, ours = tie_blind(theirs), tie_blind(ours)
    assert ours == theirs, differences(ours, theirs)[:10]
    s_theirs, s_ours = streamed(upstream, kind, body), streamed(door, kind, body)
    if ties:
        s_theirs, s_ours = [tie_blind(c) for c in s_theirs], [tie_blind(c) for c in s_ours]
    assert merged(s_ours) == merged(s_theirs), differences(merged(s_ours), merged(s_theirs))[:10]
    assert shape(s_ours) == shape(s_theirs)
    return ours, merged(s_ours)


def response_fields(response: Any) -> dict[str, Any]:
    """A Responses answer without what differs between any two servers or calls: ids (the
    response's, its items' and calls'), the clock, and the prefix cache's ``cached_tokens``."""
    out: dict[str, Any] = response.model_dump(exclude={"id", "created_at"})
    for item in out["output"]:
        item.pop("id", None)
        item.pop("call_id", None)
    details = (out.get("usage") or {}).get("input_tokens_details") or {}
    details.pop("cached_tokens", None)
    return out


def _arguments(answer: dict[str, Any]) -> dict[str, Any]:
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    return dict(json.loads(call["function"]["arguments"]))


def _forced_call(answer: dict[str, Any]) -> None:
    """The tool was forced: vLLM's structural tag made the model write a call to it (how
    `vllm serve` then reports it, tool_calls or text, is compared by ``same``)."""
    message = answer["choices"][0]["message"]
    assert "get_weather" in json.dumps(message)


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"name": "answer", "schema": SCHEMA}


class TestTools:
    """The hermes fleet: tool calls, structured outputs, echo and logprobs."""

    # -- tools and reasoning ----------

    def test_tool_choice_required(self, sides):
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required"}
        answer, streamed_ = same(sides, "chat", {**body, **GREEDY, "max_tokens": 200})
        _forced_call(answer)

    def test_tool_choice_named(self, sides):
        named = {"type": "function", "function": {"name": "get_weather"}}
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": named}
        answer, streamed_ = same(sides, "chat", {**body, **GREEDY, "max_tokens": 200})
        _forced_call(answer)

    def test_tool_choice_auto_parses_the_models_markup(self, sides):
        # The random model writes no markup of its own: a regex makes it write a hermes call.
        call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
        regex = call.replace("{", "\\{").replace("}", "\\}")
        body = {
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": "auto",
            "structured_outputs": {"regex": regex},
            "skip_special_tokens": False,
        }
        answer, streamed_ = same(sides, "chat", {**body, **GREEDY, "max_tokens": 200})
        assert _arguments(answer) == {"city": "Rome"}
        assert answer["choices"][0]["finish_reason"] == "tool_calls"
        # (Streamed, hermes looks for its markup tokens, which the regex spells in bytes:
        # compared with upstream's above, whatever it makes of them.)

    def test_a_responses_function_call_answers_as_vllm_serve(self, sides):
        # The Responses API over the same parser: the regex makes the model write a hermes
        # call, which vLLM's Responses serving reports as a function_call item.
        model, upstream, door = sides
        call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
        regex = call.replace("{", "\\{").replace("}", "\\}")
        function = {"type": "function", **TOOLS[0]["function"]}
        body = {
            "model": model,
            "input": ASK[0]["content"],
            "tools": [function],
            "max_output_tokens": 200,
            "temperature": 0.0,
            "extra_body": {
                "structured_outputs": {"regex": regex},
                "skip_special_tokens": False,
                "seed": 0,
            },
        }
        ours, theirs = (response_fields(c.responses.create(**body)) for c in (door, upstream))
        assert ours == theirs, differences(ours, theirs)[:10]
        (item,) = [o for o in ours["output"] if o["type"] == "function_call"]
        assert (item["name"], json.loads(item["arguments"])) == ("get_weather", {"city": "Rome"})
        ours_events, theirs_events = (
            list(c.responses.create(**body, stream=True)) for c in (door, upstream)
        )
        finals = [events[-1] for events in (ours_events, theirs_events)]
        assert [e.type for e in finals] == ["response.completed"] * 2
        assert response_fields(finals[0].response) == response_fields(finals[1].response) == ours

    # -- structured outputs ----------

    @pytest.mark.parametrize(
        "extra",
        [
            {"response_format": {"type": "json_schema", "json_schema": JSON_SCHEMA}},
            {"response_format": {"type": "json_object"}},
            {"structured_outputs": {"json": SCHEMA}},
            {"structured_outputs": {"regex": "(yes|no)!"}},
            {"structured_outputs": {"choice": ["left", "right"]}},
            {"structured_outputs": {"grammar": 'root ::= "a" ("b" | "c")'}},
        ],
        ids=["json_schema", "json_object", "json", "regex", "choice", "grammar"],
    )
    def test_structured_outputs(self, sides, extra):
        body = {"messages": ASK, **extra, **GREEDY, "max_tokens": 64}
        answer, _ = same(sides, "chat", body)
        text = answer["choices"][0]["message"]["content"]
        forced = extra.get("structured_outputs", {})
        if "choice" in forced:
            assert text in forced["choice"]
        elif "regex" in forced:
            assert text in ("yes!", "no!")
        elif "grammar" in forced:
            assert text in ("ab", "ac")
        elif answer["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert text.lstrip().startswith("{")  # JSON, cut short by max_tokens

    # -- echo and logprobs ----------

    def test_echo_with_max_tokens_0_and_logprobs(self, sides):
        model, upstream, door = sides
        body = {"model": model, "prompt": "The capital of France", "echo": True, "max_tokens": 0}
        body |= {"logprobs": 2}
        # Whole only: the door answers streamed echo with logprobs with a 400 (see the docs).
        ours, theirs = whole(door, "completion", body), whole(upstream, "completion", body)
        assert ours == theirs
        choice = ours["choices"][0]
        assert choice["text"] == body["prompt"]
        assert choice["logprobs"]["token_logprobs"][0] is None
        assert all(isinstance(x, float) for x in choice["logprobs"]["token_logprobs"][1:])

    def test_echo_streamed_without_logprobs(self, sides):
        answer, streamed_ = same(
            sides, "completion", {"prompt": "Hello", "echo": True, "max_tokens": 4, **GREEDY}
        )
        assert answer["choices"][0]["text"].startswith("Hello")
        assert streamed_[0]["text"] == answer["choices"][0]["text"]

    def test_completions_logprobs_k(self, sides):
        answer, streamed_ = same(
            sides,
            "completion",
            {"prompt": "Hello", "max_tokens": 6, "logprobs": 3, **GREEDY},
            ties=True,
        )
        tops = answer["choices"][0]["logprobs"]["top_logprobs"]
        # (Candidates whose texts are equal share one key, as in vLLM's answer.)
        assert all(1 <= len(t) <= 4 for t in tops)
        assert streamed_[0]["lp"]

    def test_completions_logprobs_k_with_a_sampled_token_outside_the_top_k(self, sides):
        # Sampled at a high temperature, some tokens fall outside the top 1: then vLLM lists 2.
        answer, _ = same(
            sides,
            "completion",
            {"prompt": "Hello", "max_tokens": 16, "logprobs": 1, "temperature": 2.0, "seed": 3},
            ties=True,
        )
        tops = answer["choices"][0]["logprobs"]["top_logprobs"]
        assert any(len(t) == 2 for t in tops)

    def test_prompt_logprobs(self, sides):
        # Whole only: vLLM refuses prompt_logprobs on a stream (400), as the door does.
        model, upstream, door = sides
        body = {"model": model, "messages": ASK, "max_tokens": 2, **GREEDY, "prompt_logprobs": 2}
        ours, theirs = whole(door, "chat", body), whole(upstream, "chat", body)
        assert ours == theirs, differences(ours, theirs)[:10]
        assert ours["prompt_logprobs"][0] is None and ours["prompt_logprobs"][1]

    def test_chat_logprobs_top_logprobs(self, sides):
        answer, streamed_ = same(
            sides,
            "chat",
            {
                "messages": ASK,
                "max_tokens": 4,
                "logprobs": True,
                "top_logprobs": 2,
                **GREEDY,
            },
        )
        content = answer["choices"][0]["logprobs"]["content"]
        assert content and all(len(e["top_logprobs"]) == 2 for e in content)
        assert streamed_[0]["lp"]


class TestReasoning:
    """The hermes + deepseek_r1 fleet (started after the other is stopped)."""

    def test_reasoning_goes_to_its_field(self, reasoning_sides):
        messages = [{"role": "user", "content": "Think first."}]
        answer, streamed_ = same(
            reasoning_sides, "chat", {"messages": messages, **GREEDY, "max_tokens": 12}
        )
        # deepseek_r1: the unfinished thought is reasoning, nothing of it is content.
        message = answer["choices"][0]["message"]
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        assert reasoning and not message["content"]
        assert streamed_[0]["reasoning"] == reasoning
