"""vLLM ``SamplingParams`` <-> the wire's ``sampling_params`` map, and ``max_tokens`` defaults."""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, SamplingParams

__all__ = [
    "ALLOWED_FIELDS",
    "IGNORED_FIELDS",
    "MaxTokensDefaults",
    "SamplingParamsRefused",
    "default_max_tokens",
    "sampling_params_from_wire",
    "sampling_params_to_wire",
]


def sampling_params_to_wire(params: SamplingParams) -> dict[str, Any]:
    """Upstream's serialization of ``SamplingParams`` (``omit_defaults``), plus ``max_tokens``
    always.

    That serialization leaves out a ``max_tokens`` of 16, its dataclass default, but upstream's
    generate reads an absent ``max_tokens`` as "the room left in the context", not as 16: a
    caller asking for exactly 16 tokens would get thousands.
    Writing the resolved ``max_tokens`` keeps the document upstream-shaped and makes it mean
    what the caller asked for on either generate server.
    """
    fields: dict[str, Any] = msgspec.to_builtins(params)
    if params.max_tokens is not None:
        fields["max_tokens"] = params.max_tokens
    return fields


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
# Written by render for the engine's own bookkeeping; the server sets them per request, or
# vLLM derives them again (``output_text_buffer_length`` from the stop strings).
IGNORED_FIELDS = frozenset(
    {"output_kind", "skip_clone", "stream_interval", "output_text_buffer_length"}
)


class MaxTokensDefaults(msgspec.Struct, frozen=True):
    """What upstream's generate falls back on when a request leaves ``max_tokens`` out."""

    max_model_len: int
    generation_config: int | None = None
    """``max_tokens`` from the model's generation config (``--generation-config``), if any."""
    override: int | None = None
    """``max_new_tokens`` from ``--override-generation-config``, if any."""

    @classmethod
    def from_model_config(cls, model_config: Any) -> MaxTokensDefaults:
        # The same two sources upstream's OpenAI and generate servers read.
        defaults = model_config.get_diff_sampling_param()
        if model_config.generation_config not in ("auto", "vllm"):
            override = defaults.get("max_tokens")
        else:
            override = (getattr(model_config, "override_generation_config", None) or {}).get(
                "max_new_tokens"
            )
        return cls(model_config.max_model_len, defaults.get("max_tokens"), override)


def default_max_tokens(defaults: MaxTokensDefaults, prompt_len: int) -> int:
    """``max_tokens`` for a request that left it out: what upstream's generate uses, i.e. the
    room left in the context, capped by the model's generation config (not 16, the dataclass
    default of ``SamplingParams``)."""
    return get_max_tokens(
        max_model_len=defaults.max_model_len,
        max_tokens=None,
        input_length=prompt_len,
        default_sampling_params={"max_tokens": defaults.generation_config},
        override_max_tokens=defaults.override,
    )


class SamplingParamsRefused(ValueError):
    """Wire sampling fields that cannot become ``SamplingParams``; ``param`` names the field.

    Plain ``ValueError`` on purpose: each service maps it onto its own error (a 400).
    """

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def sampling_params_from_wire(
    fields: dict[str, Any], *, stream: bool, max_n: int, max_logprobs: int
) -> SamplingParams:
    """Validated ``SamplingParams`` for the wire's ``sampling_params`` map, through
    ``ALLOWED_FIELDS``; every refusal is ``SamplingParamsRefused``."""
    unknown = set(fields) - ALLOWED_FIELDS - IGNORED_FIELDS
    if unknown:
        shown = ", ".join(sorted(str(k)[:40] for k in unknown)[:5])
        raise SamplingParamsRefused(
            f"sampling_params fields not accepted here: {shown}", param="sampling_params"
        )
    given = {k: v for k, v in fields.items() if k in ALLOWED_FIELDS}
    try:
        params = msgspec.convert(given, SamplingParams)
    except (msgspec.ValidationError, VLLMClientError, ValueError, TypeError) as exc:
        raise SamplingParamsRefused(
            f"invalid sampling_params: {str(exc.args[0] if exc.args else exc)[:200]}",
            param="sampling_params",
        ) from None
    if not 1 <= params.n <= max_n:
        raise SamplingParamsRefused(f"n must be in [1, {max_n}]", param="sampling_params.n")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > max_logprobs:
            raise SamplingParamsRefused(
                f"{name} must be at most {max_logprobs}", param=f"sampling_params.{name}"
            )
    params.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    return params
