"""Sampling fields from the wire -> vLLM ``SamplingParams``, through an allowlist."""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, SamplingParams

from .errors import UnsupportedSamplingParams

__all__ = ["ALLOWED_FIELDS", "IGNORED_FIELDS", "build_sampling_params"]

# What a caller may set. Left out on purpose: `extra_args` and `structured_outputs` (engine-side
# plugins and grammars are a server decision), and vLLM's private `_...` fields.
ALLOWED_FIELDS = frozenset(
    {
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "skip_reading_prefix_cache",
        "flat_logprobs",
        "logprob_token_ids",
        "repetition_detection",
    }
)
# Written by render for the engine's own bookkeeping; the server sets them per request.
IGNORED_FIELDS = frozenset({"output_kind", "skip_clone", "stream_interval"})


def build_sampling_params(
    fields: dict[str, Any], *, stream: bool, max_n: int, max_logprobs: int
) -> SamplingParams:
    """Validated ``SamplingParams``; every refusal is UnsupportedSamplingParams (400)."""
    unknown = set(fields) - ALLOWED_FIELDS - IGNORED_FIELDS
    if unknown:
        shown = ", ".join(sorted(str(k)[:40] for k in unknown)[:5])
        raise UnsupportedSamplingParams(
            f"sampling_params fields not accepted here: {shown}", param="sampling_params"
        )
    given = {k: v for k, v in fields.items() if k in ALLOWED_FIELDS}
    try:
        params = msgspec.convert(given, SamplingParams)
    except (msgspec.ValidationError, VLLMClientError, ValueError, TypeError) as exc:
        raise UnsupportedSamplingParams(
            f"invalid sampling_params: {str(exc.args[0] if exc.args else exc)[:200]}",
            param="sampling_params",
        ) from None
    if not 1 <= params.n <= max_n:
        raise UnsupportedSamplingParams(f"n must be in [1, {max_n}]", param="sampling_params.n")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > max_logprobs:
            raise UnsupportedSamplingParams(
                f"{name} must be at most {max_logprobs}", param=f"sampling_params.{name}"
            )
    params.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    return params
