"""Sampling fields from the wire -> vLLM ``SamplingParams``; refusals become this service's 400.

The conversion itself (allowlist, ``max_tokens`` defaults) is ``tandem_vllm.sampling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem_http import TokenOutOfVocabulary
from tandem_vllm import sampling as vllm_sampling
from tandem_vllm.sampling import (
    SamplingParamsRefused,
    TokenIdsOutOfVocabulary,
    default_max_tokens,
    sampling_params_from_wire,
)
from tandem_wire import TandemHTTPError

from .errors import (
    InvalidStructuredOutput,
    StructuredOutputsDisabled,
    StructuredOutputTooLarge,
    UnsupportedSamplingParams,
)

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

    from .engine import Engine

__all__ = ["build_sampling_params", "check_structured_outputs", "default_max_tokens"]

# tandem_vllm's refusals -> this service's errors; any other refusal is
# UnsupportedSamplingParams.
_ERRORS: dict[type[SamplingParamsRefused], type[TandemHTTPError]] = {
    TokenIdsOutOfVocabulary: TokenOutOfVocabulary,
    vllm_sampling.StructuredOutputsDisabled: StructuredOutputsDisabled,
    vllm_sampling.StructuredOutputTooLarge: StructuredOutputTooLarge,
    vllm_sampling.InvalidStructuredOutput: InvalidStructuredOutput,
}


def _refused(exc: SamplingParamsRefused) -> TandemHTTPError:
    error = _ERRORS.get(type(exc), UnsupportedSamplingParams)
    return error(exc.message, param=exc.param)


def build_sampling_params(
    fields: dict[str, Any],
    *,
    stream: bool,
    max_n: int,
    max_logprobs: int,
    vocab_size: int,
    max_structured_output_bytes: int | None,
) -> SamplingParams:
    """Validated ``SamplingParams``; every refusal is a 400 (UnsupportedSamplingParams,
    TokenOutOfVocabulary for a token id the model does not have, the structured-output errors
    for ``structured_outputs`` off (None), over ``max_structured_output_bytes`` or malformed)."""
    try:
        params = sampling_params_from_wire(
            fields,
            stream=stream,
            max_n=max_n,
            max_logprobs=max_logprobs,
            vocab_size=vocab_size,
            max_structured_output_bytes=max_structured_output_bytes,
        )
    except SamplingParamsRefused as exc:
        raise _refused(exc) from None
    if not params.stop:
        # Answers carry token ids only: vLLM's output loop would decode text (and logprobs'
        # token strings) on every engine step for nothing but matching stop strings.
        params.detokenize = False
    return params


def check_structured_outputs(engine: Engine, params: SamplingParams) -> None:
    """vLLM's own check of the grammar ``params`` asks for, before the engine gets it: a 400
    (InvalidStructuredOutput) instead of a failure at add_request or in the engine core."""
    try:
        engine.check_structured_outputs(params)
    except SamplingParamsRefused as exc:
        raise _refused(exc) from None
