"""Two servers' OpenAI answers compared as an `openai` SDK user compares them: whole documents
field for field, streams merged per choice and by the shape of their chunk sequence."""

from __future__ import annotations

import json
import re
from typing import Any

# Fields that differ between any two answers, even of one server.
EXCLUDED = {
    "id": "a fresh request id per answer",
    "created": "the second the answer was made",
    # Compared on its own (``fingerprints``), so that its one difference hides no other.
    "system_fingerprint": "a hash of each engine's whole configuration",
}

# The hash in a fingerprint (vLLM's ``compute_hash`` of the engine's configuration): the door's
# generate nodes take options (weight transfer) that vllm serve does not.
_FINGERPRINT_HASH = re.compile(r"-[0-9a-f]{8}$")

# Two engines (ours and vllm serve's) compute the same logits in different batches.
LOGPROB_ABS = 1e-3

DONE = "[DONE]"


def client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120, max_retries=0)


def _api(url: str, chat: bool) -> Any:
    sdk = client(url)
    return sdk.chat.completions if chat else sdk.completions


def whole(url: str, chat: bool, **request: Any) -> dict[str, Any]:
    """A non-streamed answer: the document as sent (the SDK parses it too, as a user's would)."""
    raw = _api(url, chat).with_raw_response.create(**request)
    raw.parse()
    document: dict[str, Any] = raw.http_response.json()
    return document


def streamed(url: str, chat: bool, **request: Any) -> list[Any]:
    """A streamed answer: each event's document in order, then ``DONE`` if the stream ended
    with ``data: [DONE]`` (the SDK's own stream reader stops there without saying so)."""
    events: list[Any] = []
    with _api(url, chat).with_streaming_response.create(stream=True, **request) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == DONE:
                events.append(DONE)
                continue
            events.append(json.loads(payload))
    return events


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ: every path, with both values (floats within
    ``LOGPROB_ABS``: they are logprobs; top-level ``EXCLUDED`` fields are skipped; a field
    left out equals one sent as null: the SDK reads both as None)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if _TOP_CANDIDATES.search(path) and _all_floats(ours) and _all_floats(theirs):
            return _candidate_differences(ours, theirs, path)
        out = []
        for key in sorted(set(ours) | set(theirs), key=str):
            where = f"{path}.{key}"
            if not path and key in EXCLUDED:
                continue
            if key not in ours or key not in theirs:
                if ours.get(key) is None and theirs.get(key) is None:
                    continue
                side = "ours" if key not in ours else "theirs"
                other = ours.get(key, theirs.get(key))
                out.append(f"{where}: missing in {side} (the other: {other!r})")
                continue
            out += differences(ours[key], theirs[key], where)
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [
                f"{path}: {len(ours)} items in ours, {len(theirs)} in theirs: {ours!r} | {theirs!r}"
            ]
        out = []
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            out += differences(a, b, f"{path}[{i}]")
        return out
    if isinstance(ours, float) or isinstance(theirs, float):
        numbers = not isinstance(ours, bool) and not isinstance(theirs, bool)
        if ours == theirs or (
            numbers
            and isinstance(ours, int | float)
            and isinstance(theirs, int | float)
            and abs(ours - theirs) <= LOGPROB_ABS
        ):
            return []
    elif type(ours) is type(theirs) and ours == theirs:
        return []
    return [f"{path}: ours {ours!r} != theirs {theirs!r}"]


# A completions position's candidates: {token text: logprob}.
_TOP_CANDIDATES = re.compile(r"top_logprobs(\[\d+\])?$")


def _all_floats(d: dict[Any, Any]) -> bool:
    return all(isinstance(v, float) for v in d.values())


def _candidate_differences(
    ours: dict[str, float], theirs: dict[str, float], path: str
) -> list[str]:
    """Candidates compared token by token, except among ties: when two tokens have the same
    logprob, which one a top-k keeps is the engine's tie-break (k and k + 1 break them
    differently), so a token listed on one side only must tie with one listed on the other
    side only."""
    out = [
        f"{path}.{t}: ours {ours[t]!r} != theirs {theirs[t]!r}"
        for t in sorted(set(ours) & set(theirs))
        if abs(ours[t] - theirs[t]) > LOGPROB_ABS
    ]
    only_ours = sorted(ours[t] for t in set(ours) - set(theirs))
    only_theirs = sorted(theirs[t] for t in set(theirs) - set(ours))
    ties = len(only_ours) == len(only_theirs) and all(
        abs(a - b) <= LOGPROB_ABS for a, b in zip(only_ours, only_theirs, strict=True)
    )
    if not ties:
        mine = {t: ours[t] for t in set(ours) - set(theirs)}
        other = {t: theirs[t] for t in set(theirs) - set(ours)}
        out.append(f"{path}: candidates ours only {mine!r}, theirs only {other!r} (no ties)")
    return out


def fingerprints(answer: Any) -> list[Any]:
    """Where an answer names its engine, and how: a whole document's ``system_fingerprint``;
    for a stream, each chunk's that has one, with the chunk's kind (its hash left out: it is
    of each engine's whole configuration)."""

    def form(value: Any) -> Any:
        return _FINGERPRINT_HASH.sub("-<hash>", value) if isinstance(value, str) else value

    if not isinstance(answer, list):
        return [form(answer.get("system_fingerprint"))]
    out = []
    for chunk in _chunks(answer):
        if chunk.get("system_fingerprint") is not None:
            choices = chunk.get("choices") or []
            kind = "finish" if any(c.get("finish_reason") for c in choices) else "other"
            out.append((kind if choices else "usage", form(chunk["system_fingerprint"])))
    return out


def assert_same(ours: Any, theirs: Any, what: str = "answer") -> None:
    found = differences(ours, theirs)
    assert not found, f"the door's {what} differs from vllm serve's:\n" + "\n".join(found[:20])


# A chunk's fields that ``merged`` reads into its per-choice view.
_PER_CHOICE = ("choices", "usage", "prompt_token_ids")


def _chunks(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if e != DONE]


def merged(events: list[Any], chat: bool) -> dict[str, Any]:
    """A stream's answer as its reader assembles it: per choice index, the text, token ids,
    logprobs, finish and stop reasons, the usage of its chunks (``continuous_usage_stats``);
    the stream's final usage.

    Each chunk's usage is read against the tokens sent so far (``return_token_ids``): the
    offset of its ``completion_tokens`` from them, and its ``prompt_tokens``; the last chunk's
    usage whole. How many tokens one engine step hands over depends on the machine's load, what
    each count says about the tokens sent does not."""
    choices: dict[int, dict[str, Any]] = {}
    top: dict[str, Any] = {"fields": [], "usage": None}
    for chunk in _chunks(events):
        # The chunk's own fields (model, object, system_fingerprint, ...), in runs.
        fields = {
            k: v
            for k, v in chunk.items()
            if k not in EXCLUDED and k not in _PER_CHOICE and v is not None
        }
        if not top["fields"] or top["fields"][-1] != fields:
            top["fields"].append(fields)
        if "prompt_token_ids" in chunk:  # chat sends it once, on the role chunk
            top.setdefault("prompt_token_ids", []).append(chunk["prompt_token_ids"])
        if not chunk.get("choices"):
            top["usage"] = chunk.get("usage")
            continue
        for c in chunk["choices"]:
            got = choices.setdefault(
                c["index"],
                {
                    "text": "",
                    "token_ids": [],
                    "logprobs": [],
                    "finish_reason": None,
                    "stop_reason": None,
                    "usage": None,
                    "usage_offsets": [],
                },
            )
            delta = c.get("delta", {})
            if "role" in delta:
                got.setdefault("role", []).append(delta["role"])
            got["text"] += (delta.get("content") if chat else c.get("text")) or ""
            got["token_ids"] += c.get("token_ids") or []
            if c.get("prompt_token_ids") is not None:
                got.setdefault("prompt_token_ids", []).append(c["prompt_token_ids"])
            lp = c.get("logprobs")
            if lp is not None:
                got["logprobs"] += _logprob_positions(lp, chat)
            for key in ("finish_reason", "stop_reason"):
                if c.get(key) is not None:
                    got[key] = c[key]
            usage = chunk.get("usage")
            if usage is not None:
                sent = len(got["token_ids"])
                seen = (usage["completion_tokens"] - sent, usage["prompt_tokens"])
                if seen not in got["usage_offsets"]:
                    got["usage_offsets"].append(seen)
                got["usage"] = usage
    return {**top, "choices": [choices[i] for i in sorted(choices)]}


def _logprob_positions(lp: dict[str, Any], chat: bool) -> list[Any]:
    if chat:
        return list(lp.get("content") or [])
    keys = ("text_offset", "tokens", "token_logprobs", "top_logprobs")
    return [dict(zip(keys, row, strict=True)) for row in zip(*(lp[k] for k in keys), strict=True)]


def carries_output(choice: dict[str, Any], chat: bool) -> bool:
    """Whether a streamed choice carries output: text, reasoning, tool calls, token ids or
    logprobs (a finish chunk that does counts as a delta and then the finish in a shape)."""
    delta = choice.get("delta") or {}
    text = delta.get("content") if chat else choice.get("text")
    lp = choice.get("logprobs")
    return bool(
        text
        or choice.get("token_ids")
        or any(delta.get(f) for f in ("reasoning", "reasoning_content", "tool_calls"))
        or (lp is not None and _logprob_positions(lp, chat))
    )


def shape(events: list[Any], chat: bool) -> dict[str, Any]:
    """The chunk sequence's shape: per choice, the kind of each of its chunks (the role's,
    saying whether it carries text; deltas; the finish) and whether it carries usage, a run of
    deltas counted as one; then the chunks after the last choice's, and the terminator.

    How many tokens one chunk carries, and so which delta holds text back for a possible stop
    string (an empty delta), follows the machine's load, on vllm serve as on the door: the
    merged answer (``merged``) is where the text is compared. For the same reason a finish
    chunk that carries tokens counts as a delta and then the finish: under load the last
    tokens and the finish come in one engine output, on either side."""
    per_choice: dict[int, list[str]] = {}
    tail: list[str] = []
    for event in events:
        if event == DONE:
            tail.append(DONE)
            continue
        if not event.get("choices"):
            tail.append("usage" if event.get("usage") else "empty")
            continue
        assert not tail, f"a choice's chunk after {tail}: {event}"
        for c in event["choices"]:
            delta = c.get("delta", {})
            text = delta.get("content") if chat else c.get("text")
            if "role" in delta:
                found = ["role+text" if text else "role"]
            elif c.get("finish_reason") is None:
                found = ["delta"]
            elif carries_output(c, chat):
                found = ["delta", "finish"]
            else:
                found = ["finish"]
            usage = "+usage" if event.get("usage") is not None else ""
            kinds = per_choice.setdefault(c["index"], [])
            for kind in found:
                if not kinds or kinds[-1] != kind + usage or kind != "delta":
                    kinds.append(kind + usage)
    return {"choices": [per_choice[i] for i in sorted(per_choice)], "tail": tail}


def choices_of(answer: Any, chat: bool) -> list[dict[str, Any]]:
    """Per choice: text, token ids, logprob positions, finish and stop reasons, of a whole
    document or of a stream's events (merged)."""
    if isinstance(answer, list):
        return list(merged(answer, chat)["choices"])
    out = []
    for c in answer["choices"]:
        lp = c.get("logprobs")
        out.append(
            {
                "text": c["message"]["content"] if chat else c["text"],
                "token_ids": c.get("token_ids") or [],
                "logprobs": [] if lp is None else _logprob_positions(lp, chat),
                "finish_reason": c.get("finish_reason"),
                "stop_reason": c.get("stop_reason"),
            }
        )
    return out


def warm(door: str, serve: str, chat: bool, **request: Any) -> None:
    """``request``'s prompt into both sides' prefix caches (one token each), before an
    ``n > 1`` comparison: vLLM hands the engine the n copies one by one, and whether a copy's
    prefill reads a sibling's cached blocks or computes them follows the scheduling, which
    can move a sampled token. Warmed, every copy reads the same cached blocks."""
    one = {**request, "n": 1, "max_tokens": 1, "stream": False}
    one.pop("max_completion_tokens", None)
    for url in (door, serve):
        _api(url, chat).create(**one)


def answers(door: str, serve: str, chat: bool, stream: bool, **request: Any) -> tuple[Any, Any]:
    """The same request to the door and to vllm serve, both answers checked equal (whole: the
    documents; streamed: merged per choice, and the chunk sequences' shapes); vllm serve's
    answer is returned for the caller's own checks of what the request exercised."""
    if not stream:
        ours, theirs = whole(door, chat, **request), whole(serve, chat, **request)
        assert_same(ours, theirs)
        return ours, theirs
    ours, theirs = streamed(door, chat, **request), streamed(serve, chat, **request)
    assert_same(merged(ours, chat), merged(theirs, chat), "merged stream")
    assert_same(shape(ours, chat), shape(theirs, chat), "stream's chunk sequence")
    return ours, theirs
