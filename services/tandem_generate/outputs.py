"""Engine outputs -> wire responses and stream chunks: token ids and integer-keyed logprobs, and
in ``text`` mode the engine's detokenized text and logprobs with decoded tokens."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tandem_wire import (
    ChoiceLogprobs,
    GenerateChoice,
    GenerateResponse,
    GenerateStreamChoice,
    GenerateStreamResponse,
    GenerateTextChoice,
    GenerateTextResponse,
    GenerateTextStreamChoice,
    GenerateTextStreamResponse,
    PromptLogprob,
    TextLogprob,
    TextLogprobContent,
    TextLogprobs,
    TokenLogprob,
    TokenLogprobContent,
    UsageInfo,
    WeightVersionSpan,
)

__all__ = [
    "clamp",
    "choice_logprobs",
    "text_logprobs",
    "prompt_logprobs",
    "full_response",
    "stream_choice",
    "prompt_details",
    "usage_chunk",
    "weight_versions",
]

FLOOR = -9999.0
"""What -inf and NaN logprobs are sent as (the OpenAI shapes' floor, as upstream does)."""


def clamp(logprob: float) -> float:
    return FLOOR if math.isnan(logprob) else max(logprob, FLOOR)


def choice_logprobs(
    token_ids: Sequence[int], steps: Sequence[Mapping[int, Any] | None], top_n: int
) -> ChoiceLogprobs:
    """Per generated token: its logprob and the top ``top_n`` candidates in engine order
    (sampled token first, then by rank). A rank of 0 (NaN logprob) is no rank: sent as null."""
    content = []
    for token_id, step in zip(token_ids, steps, strict=False):
        sampled = None if step is None else step.get(token_id)
        if step is None or sampled is None:
            content.append(TokenLogprobContent(token_id=token_id, logprob=FLOOR))
            continue
        top = [
            TokenLogprob(token_id=t, logprob=clamp(lp.logprob), rank=lp.rank or None)
            for i, (t, lp) in enumerate(step.items())
            if top_n == -1 or i < max(top_n, 1)
        ]
        content.append(
            TokenLogprobContent(
                token_id=token_id,
                logprob=clamp(sampled.logprob),
                rank=sampled.rank or None,
                top_logprobs=top,
            )
        )
    return ChoiceLogprobs(content=content)


def text_logprobs(
    token_ids: Sequence[int],
    steps: Sequence[Mapping[int, Any] | None],
    top_n: int,
    tokenizer: Any,
) -> TextLogprobs:
    """``text`` mode's logprobs, as upstream's generate writes them (vLLM's chat shape): per
    generated token its decoded text, bytes and logprob, and the first ``max(top_n, 1)``
    candidates in engine order."""
    content = []
    for token_id, step in zip(token_ids, steps, strict=False):
        sampled = None if step is None else step.get(token_id)
        token = _token_text(token_id, sampled, tokenizer)
        if step is None or sampled is None:
            content.append(TextLogprobContent(token=token, bytes=_utf8(token)))
            continue
        top = [
            _text_candidate(t, lp, tokenizer)
            for i, (t, lp) in enumerate(step.items())
            if top_n == -1 or i < max(top_n, 1)
        ]
        content.append(
            TextLogprobContent(
                token=token, logprob=clamp(sampled.logprob), bytes=_utf8(token), top_logprobs=top
            )
        )
    return TextLogprobs(content=content)


def _text_candidate(token_id: int, logprob: Any, tokenizer: Any) -> TextLogprob:
    token = _token_text(token_id, logprob, tokenizer)
    return TextLogprob(token=token, logprob=clamp(logprob.logprob), bytes=_utf8(token))


def _token_text(token_id: int, logprob: Any, tokenizer: Any) -> str:
    # The engine's own decoding when it made one (split UTF-8 pieces completed), else alone.
    decoded = None if logprob is None else logprob.decoded_token
    return str(decoded) if decoded is not None else str(tokenizer.decode([token_id]))


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def weight_versions(spans: Sequence[Any] | None) -> list[WeightVersionSpan] | None:
    """vLLM's ``WeightVersionSpan``s of an output (set on its final output only)."""
    if spans is None:
        return None
    return [WeightVersionSpan(version=s.version, start=s.start, end=s.end) for s in spans]


def prompt_logprobs(
    steps: Sequence[Mapping[int, Any] | None] | None,
) -> list[dict[str, PromptLogprob] | None] | None:
    if steps is None:
        return None
    return [
        None
        if step is None
        else {
            str(t): PromptLogprob(logprob=clamp(lp.logprob), rank=lp.rank) for t, lp in step.items()
        }
        for step in steps
    ]


def full_response(
    result: Any,
    *,
    request_id: str,
    model: str,
    top_n: int | None,
    echo_prompt: bool,
    placeholders: Any = None,
    text: Any = None,
    cached_tokens: bool = False,
) -> GenerateResponse:
    """The non-streaming answer for a finished ``RequestOutput``; ``text``: the tokenizer of
    a ``text``-mode answer (None: ``tokens`` mode); ``cached_tokens``: the usage tells the
    engine's prefix-cache hits."""
    choices: list[Any] = []
    generated = 0
    for out in result.outputs:
        ids = list(out.token_ids)
        generated += len(ids)
        fields = _choice_fields(out, ids, top_n, text)
        fields["finish_reason"] = out.finish_reason or "stop"
        choices.append(
            GenerateChoice(**fields)
            if text is None
            else GenerateTextChoice(text=out.text, **fields)
        )
    n_prompt = len(result.prompt_token_ids or [])
    answer = GenerateResponse if text is None else GenerateTextResponse
    return answer(
        request_id=request_id,
        choices=choices,
        model=model,
        created=int(time.time()),
        usage=UsageInfo(
            prompt_tokens=n_prompt,
            completion_tokens=generated,
            total_tokens=n_prompt + generated,
            prompt_tokens_details=prompt_details(result.num_cached_tokens, cached_tokens),
        ),
        prompt_logprobs=prompt_logprobs(result.prompt_logprobs),
        prompt_token_ids=list(result.prompt_token_ids) if echo_prompt else None,
        mm_placeholders=placeholders if echo_prompt else None,
        kv_transfer_params=result.kv_transfer_params,
    )


def stream_choice(out: Any, top_n: int | None, text: Any = None) -> GenerateStreamChoice:
    """The new tokens of one sample in a DELTA ``RequestOutput`` (``text``: as in
    ``full_response``; the text is the delta since the sample's previous chunk)."""
    fields = _choice_fields(out, list(out.token_ids), top_n, text)
    if text is None:
        return GenerateStreamChoice(**fields)
    return GenerateTextStreamChoice(text=out.text, **fields)


def _choice_fields(out: Any, ids: list[int], top_n: int | None, text: Any) -> dict[str, Any]:
    """What a whole choice and a stream choice take of one sample's output (both modes)."""
    logprobs: ChoiceLogprobs | TextLogprobs | None = None
    if top_n is not None:
        steps = out.logprobs or []
        logprobs = (
            choice_logprobs(ids, steps, top_n)
            if text is None
            else text_logprobs(ids, steps, top_n, text)
        )
    return {
        "index": out.index,
        "token_ids": ids,
        "logprobs": logprobs,
        "finish_reason": out.finish_reason,
        "stop_reason": out.stop_reason,
        "weight_versions": weight_versions(getattr(out, "weight_versions", None)),
    }


def usage_chunk(
    request_id: str,
    prompt_tokens: int,
    completion_tokens: int,
    text: bool = False,
    details: dict[str, Any] | None = None,
) -> GenerateStreamResponse:
    answer = GenerateTextStreamResponse if text else GenerateStreamResponse
    return answer(
        request_id=request_id,
        choices=[],
        usage=UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
        ),
    )


def prompt_details(num_cached_tokens: int | None, asked: bool) -> dict[str, Any] | None:
    """``prompt_tokens_details`` as upstream writes it: when asked and the engine's prefix
    cache covered some of the prompt."""
    return {"cached_tokens": num_cached_tokens} if asked and num_cached_tokens else None
