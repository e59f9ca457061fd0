"""Sampling fields from the wire -> vLLM ``SamplingParams``; refusals become this service's 400.

The conversion itself (allowlist, ``max_tokens`` defaults) is ``tandem_vllm.sampling``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem_http import TokenOutOfVocabulary
from tandem_vllm.sampling import (
    SamplingParamsRefused,
    TokenIdsOutOfVocabulary,
    default_max_tokens,
    sampling_params_from_wire,
)

from .errors import UnsupportedSamplingParams

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

__all__ = ["build_sampling_params", "default_max_tokens"]


def build_sampling_params(
    fields: dict[str, Any], *, stream: bool, max_n: int, max_logprobs: int, vocab_size: int
) -> SamplingParams:
    """Validated ``SamplingParams``; every refusal is a 400 (UnsupportedSamplingParams, or
    TokenOutOfVocabulary for a token id the model does not have)."""
    try:
        params = sampling_params_from_wire(
            fields, stream=stream, max_n=max_n, max_logprobs=max_logprobs, vocab_size=vocab_size
        )
    except TokenIdsOutOfVocabulary as exc:
        raise TokenOutOfVocabulary(exc.message, param=exc.param) from None
    except SamplingParamsRefused as exc:
        raise UnsupportedSamplingParams(exc.message, param=exc.param) from None
    if not params.stop:
        # Answers carry token ids only: vLLM's output loop would decode text (and logprobs'
        # token strings) on every engine step for nothing but matching stop strings.
        params.detokenize = False
    return params
