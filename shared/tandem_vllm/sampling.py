"""vLLM ``SamplingParams`` <-> the wire's ``sampling_params`` map, and ``max_tokens`` defaults."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import msgspec
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

from .structured_outputs import check_grammar_cost, check_matches_something

__all__ = [
    "ALLOWED_FIELDS",
    "IGNORED_FIELDS",
    "STRUCTURED_OUTPUT_FIELDS",
    "InvalidStructuredOutput",
    "MaxTokensDefaults",
    "SamplingParamsRefused",
    "StructuredOutputTooLarge",
    "StructuredOutputsDisabled",
    "TokenIdsOutOfVocabulary",
    "check_structured_outputs",
    "default_max_tokens",
    "sampling_params_from_wire",
    "sampling_params_schema",
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


# What a caller may set. Left out on purpose: `extra_args` (engine-side plugins are a server
# decision) and vLLM's private `_...` fields. `structured_outputs` is checked on its own (below).
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
        "structured_outputs",
    }
)
# Written by render for the engine's own bookkeeping; the server sets them per request, or
# vLLM derives them again (``output_text_buffer_length`` from the stop strings, the private
# ``_...`` ones from ``stop_token_ids``, ``bad_words`` and the model's generation config as
# the engine takes the request), as upstream's generate accepts them.
IGNORED_FIELDS = frozenset(
    {
        "output_kind",
        "skip_clone",
        "stream_interval",
        "output_text_buffer_length",
        "_all_stop_token_ids",
        "_eos_token_id",
        "_bad_words_token_ids",
        "_watermarking_skipped",
    }
)


def sampling_params_schema(
    ref_template: str,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """JSON Schema of the wire's ``sampling_params`` map (the accepted fields with the types
    ``SamplingParams`` declares), and the definitions it refers to through ``ref_template``."""
    hints = typing.get_type_hints(SamplingParams)
    names = sorted(ALLOWED_FIELDS | IGNORED_FIELDS)
    schemas, components = msgspec.json.schema_components(
        [hints[n] for n in names], ref_template=ref_template
    )
    schema = {
        "type": "object",
        "properties": dict(zip(names, schemas, strict=True)),
        "additionalProperties": False,
    }
    return schema, components


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


MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_BAD_WORDS = 1024
MAX_BAD_WORD_CHARS = 1024
_TOKEN_ID_LISTS = ("stop_token_ids", "allowed_token_ids", "logprob_token_ids")


class SamplingParamsRefused(ValueError):
    """Wire sampling fields that cannot become ``SamplingParams``; ``param`` names the field.

    Plain ``ValueError`` on purpose: each service maps it onto its own error (a 400).
    """

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class TokenIdsOutOfVocabulary(SamplingParamsRefused):
    """A token id in a sampling field (``allowed_token_ids``, ``logit_bias``...) that the
    model's vocabulary does not have."""


class StructuredOutputsDisabled(SamplingParamsRefused):
    """``structured_outputs`` sent where the operator turned them off."""


class StructuredOutputTooLarge(SamplingParamsRefused):
    """``structured_outputs`` larger, serialized, than the operator's bound."""


class InvalidStructuredOutput(SamplingParamsRefused):
    """A schema, regex, grammar, choice list or structural tag vLLM cannot make a grammar of."""


STRUCTURED_OUTPUT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(StructuredOutputsParams) if not f.name.startswith("_")
)
"""The fields of vLLM's ``StructuredOutputsParams`` a caller sets (``json``, ``regex``,
``choice``, ``grammar``, ``json_object``, ``structural_tag`` and their options); its private
``_backend`` fields are the server's to set, and dropped (render's documents carry them)."""


def sampling_params_from_wire(
    fields: dict[str, Any],
    *,
    stream: bool,
    max_n: int,
    max_logprobs: int,
    vocab_size: int | None = None,
    max_structured_output_bytes: int | None = None,
) -> SamplingParams:
    """Validated ``SamplingParams`` for the wire's ``sampling_params`` map, through
    ``ALLOWED_FIELDS``; every refusal is ``SamplingParamsRefused``. With ``vocab_size``, every
    token id the fields name is checked against the vocabulary (vLLM's engine would fail on
    one outside it, or index past its logits). ``structured_outputs`` are taken up to
    ``max_structured_output_bytes`` (as JSON); None refuses them. Their grammar is checked by
    ``check_structured_outputs``, which needs the engine's configuration."""
    unknown = set(fields) - ALLOWED_FIELDS - IGNORED_FIELDS
    if unknown:
        shown = ", ".join(sorted(str(k)[:40] for k in unknown)[:5])
        raise SamplingParamsRefused(
            f"sampling_params fields not accepted here: {shown}", param="sampling_params"
        )
    given = {k: v for k, v in fields.items() if k in ALLOWED_FIELDS}
    structured = _structured_outputs(
        given.pop("structured_outputs", None), max_structured_output_bytes
    )
    if isinstance(given.get("logit_bias"), dict):
        # JSON object keys are strings: render's own logit_bias arrives as {"123": 1.5}.
        given["logit_bias"] = _int_keys(given["logit_bias"])
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
    _check_bounds(params, vocab_size)
    params.structured_outputs = structured
    params.output_kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    return params


def _structured_outputs(value: Any, max_bytes: int | None) -> StructuredOutputsParams | None:
    """vLLM's ``StructuredOutputsParams`` for the wire's map, within the operator's bounds."""
    param = "sampling_params.structured_outputs"
    if value is None:
        return None
    if max_bytes is None:
        raise StructuredOutputsDisabled(
            "structured outputs are turned off on this server", param=param
        )
    if not isinstance(value, dict):
        raise InvalidStructuredOutput("structured_outputs must be an object", param=param)
    public = {k: v for k, v in value.items() if not str(k).startswith("_")}
    unknown = set(public) - STRUCTURED_OUTPUT_FIELDS
    if unknown:
        shown = ", ".join(sorted(str(k)[:40] for k in unknown)[:5])
        raise InvalidStructuredOutput(
            f"structured_outputs fields not accepted: {shown}", param=param
        )
    # Bounded before any parser sees it: the size of what the backend would compile.
    size = len(msgspec.json.encode(public))
    if size > max_bytes:
        raise StructuredOutputTooLarge(
            f"structured_outputs is {size} bytes as JSON; this server takes at most {max_bytes}",
            param=param,
        )
    try:
        return msgspec.convert(public, StructuredOutputsParams)
    except (msgspec.ValidationError, VLLMClientError, ValueError, TypeError) as exc:
        raise InvalidStructuredOutput(
            f"invalid structured_outputs: {str(exc.args[0] if exc.args else exc)[:200]}",
            param=param,
        ) from None


def check_structured_outputs(params: SamplingParams, vllm_config: Any, tokenizer: Any) -> None:
    """vLLM's own check of ``params.structured_outputs``, the one its input processor runs when
    the request is added (backend choice, then the backend's parse of the schema, regex or
    grammar), and ours of what that check lets through to fail in the engine core
    (``tandem_vllm.structured_outputs``); run before the request is answered, so a refusal
    is a 400 even on a stream. Sets the backend on ``params`` as vLLM does; every refusal is
    ``InvalidStructuredOutput``."""
    so = params.structured_outputs
    if so is None:
        return
    try:
        check_grammar_cost(so)
        params._validate_structured_outputs(
            vllm_config.model_config, vllm_config.structured_outputs_config, tokenizer
        )
        if so._backend == "xgrammar":
            check_matches_something(so)
    except (VLLMClientError, ValueError, TypeError, RuntimeError) as exc:
        # RuntimeError: a backend's own parser error (xgrammar's), or a RecursionError.
        raise InvalidStructuredOutput(
            f"invalid structured_outputs: {str(exc.args[0] if exc.args else exc)[:300]}",
            param="sampling_params.structured_outputs",
        ) from None


def _int_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in bias.items():
        if isinstance(key, str):
            try:
                key = int(key)
            except ValueError:
                raise SamplingParamsRefused(
                    f"logit_bias keys must be token ids, not {key[:24]!r}",
                    param="sampling_params.logit_bias",
                ) from None
        out[key] = value
    return out


def _check_bounds(params: SamplingParams, vocab_size: int | None) -> None:
    """Every list and string a caller can set has a bound; every token id is in the vocab."""
    stops = params.stop if isinstance(params.stop, list) else [params.stop] if params.stop else []
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise SamplingParamsRefused(
            f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters",
            param="sampling_params.stop",
        )
    words = params.bad_words or []
    if len(words) > MAX_BAD_WORDS or any(len(w) > MAX_BAD_WORD_CHARS for w in words):
        raise SamplingParamsRefused(
            f"at most {MAX_BAD_WORDS} bad_words of at most {MAX_BAD_WORD_CHARS} characters",
            param="sampling_params.bad_words",
        )
    if vocab_size is None:
        return
    lists: list[tuple[str, Any]] = [(n, getattr(params, n, None)) for n in _TOKEN_ID_LISTS]
    lists.append(("logit_bias", list((params.logit_bias or {}).keys())))
    for name, ids in lists:
        if not ids:
            continue
        if len(ids) > vocab_size:
            raise SamplingParamsRefused(
                f"{name} has more entries than the vocabulary ({vocab_size})",
                param=f"sampling_params.{name}",
            )
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                raise TokenIdsOutOfVocabulary(
                    f"{name}: token id {str(t)[:24]} is outside the vocabulary (size {vocab_size})",
                    param=f"sampling_params.{name}",
                )
