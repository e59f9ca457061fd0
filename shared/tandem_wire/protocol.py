"""Wire schemas for render output / generate input and generate responses (data only).

Field-for-field compatible with upstream vLLM 0.32's ``GenerateRequest``, ``MultiModalFeatures``,
``PlaceholderRangeInfo`` and token-mode generate responses. Our extensions are optional fields
that upstream ignores (``is_embed``) and the binary body, in which ``kwargs_data`` entries are
msgpack ``bin`` instead of base64 text. Schemas are generic over that entry type: ``str`` in JSON
mode, ``bytes``-like in binary mode.
"""

from __future__ import annotations

import enum
import uuid
from typing import Annotated, Any, Generic, Literal, TypeVar

from msgspec import Meta, Struct, field

__all__ = [
    "ItemT",
    "PlaceholderRange",
    "MultiModalFeatures",
    "GenerateRequest",
    "UsageInfo",
    "TokenLogprob",
    "TokenLogprobContent",
    "ChoiceLogprobs",
    "PromptLogprob",
    "WeightVersionSpan",
    "GenerateChoice",
    "GenerateResponse",
    "GenerateStreamChoice",
    "GenerateStreamResponse",
    "TextLogprob",
    "TextLogprobContent",
    "TextLogprobs",
    "GenerateTextChoice",
    "GenerateTextResponse",
    "GenerateTextStreamChoice",
    "GenerateTextStreamResponse",
    "ErrorInfo",
    "ErrorBody",
    "StreamFrameKind",
    "STREAM_FRAME_HEADER_BYTES",
    "new_request_id",
]

ItemT = TypeVar("ItemT")
"""The kwargs entry type, null included: ``str | None`` (base64) in JSON mode,
``bytes | memoryview | None`` in binary mode."""

NonNegInt = Annotated[int, Meta(ge=0)]
TokenId = Annotated[int, Meta(ge=0)]
# Every string from the wire has a bound (vLLM's own ids and hashes are far shorter).
RequestId = Annotated[str, Meta(max_length=256)]
Modality = Annotated[str, Meta(min_length=1, max_length=32)]
ItemHash = Annotated[str, Meta(min_length=1, max_length=256)]
CacheSalt = Annotated[str, Meta(min_length=1, max_length=1024)]


def new_request_id() -> str:
    """A fresh random request id (hex UUID4), as upstream generates when none is given."""
    return uuid.uuid4().hex


class PlaceholderRange(Struct, omit_defaults=True):
    """Where one multimodal item's tokens lie in ``token_ids``."""

    offset: NonNegInt
    """Index of the item's first placeholder token in ``token_ids``."""

    length: Annotated[int, Meta(gt=0)]
    """Number of tokens the range covers, embedding and non-embedding alike."""

    is_embed: list[bool] | None = None
    """Extension: per token of the range, whether it receives an embedding (length ``length``).
    Null means every token does. Needed where runs interleave text (Qwen3-VL video timestamps);
    upstream drops it."""


class MultiModalFeatures(Struct, Generic[ItemT]):
    """Per-modality hashes, placeholder ranges and processor outputs of a rendered prompt.

    Every dict is keyed by modality (``"image"``, ``"video"``, ...) and every list inside is
    parallel to ``mm_hashes[modality]``, in prompt order.
    """

    mm_hashes: dict[Modality, list[ItemHash]]
    """Item identities, the names the engine keys items by: each sent item's content id
    (``content_id(cache_salt or "", item bytes)``, see ``content_ids``); vLLM's 64-hex blake3
    of the media and processor kwargs where render sends no bytes."""

    mm_placeholders: dict[str, list[PlaceholderRange]]
    """Placeholder ranges in ``token_ids``; ranges may share tokens that are no embed position
    of either, embed positions never overlap."""

    kwargs_data: dict[str, list[ItemT]] | None = None
    """The processor outputs of each item: a msgpack-encoded kwargs item (see ``codec``),
    base64 text in JSON mode and raw ``bin`` in binary mode. A null entry means "the generate
    node already holds this item", and its ``mm_hashes`` entry is then the item's content id
    (``content_id(cache_salt or "", item bytes)``), so a node resolves it only to those very
    bytes; it answers 409 ``mm_cache_miss`` naming the ids it does not hold. Null for the whole
    field: no tensors were sent."""

    mm_metadata: dict[str, list[ItemT]] | None = None
    """Metadata-only items (grid sizes, ``keep_on_cpu`` fields) for encoder-cache transfer;
    used only with ``ec_transfer_params``. Same encoding as ``kwargs_data``."""


class GenerateRequest(Struct, Generic[ItemT]):
    """One token-in generate request: what render returns and generate accepts, unchanged."""

    token_ids: Annotated[list[TokenId], Meta(min_length=1)]
    """The prompt's token ids, placeholder tokens already expanded."""

    request_id: RequestId = field(default_factory=new_request_id)
    """Caller's id for the request, echoed in responses; random when omitted."""

    features: MultiModalFeatures[ItemT] | None = None
    """Multimodal items of the prompt; null for text-only prompts."""

    sampling_params: dict[str, Any] = field(default_factory=dict)
    """vLLM ``SamplingParams`` fields by name (``n``, ``temperature``, ``max_tokens``,
    ``logprobs``...). Validated by the generate service against what it supports."""

    model: str | None = None
    """Served model name; null means the server's model."""

    stream: bool | None = False
    """Answer with server-sent events of token deltas instead of one document."""

    stream_options: dict[str, Any] | None = None
    """OpenAI-style stream options (``include_usage``, ``continuous_usage_stats``)."""

    cache_salt: CacheSalt | None = None
    """Salt for the prefix cache, isolating tenants; 1-1024 characters."""

    priority: int = 0
    """Scheduling priority (lower first) when the engine uses priority scheduling."""

    kv_transfer_params: dict[str, Any] | None = None
    """KV-transfer parameters for disaggregated prefill (passed through)."""

    ec_transfer_params: dict[str, Any] | None = None
    """Encoder-cache transfer parameters (passed through)."""

    token_offsets: list[tuple[int, int]] | None = None
    """Character offsets per token of the source text, when render computed them."""

    content_parts: list[dict[str, Any]] | None = None
    """Raw multimodal input for the server to resolve; exclusive with ``features``."""

    reasoning_ended: bool | None = None
    """Whether reasoning ended before the first generated token, as render resolved it."""

    reasoning_parser_kwargs: dict[str, Any] | None = None
    """Kwargs for the engine-side reasoning parser (``chat_template_kwargs``)."""

    return_token_ids: bool | None = None
    """Echo the prompt token ids and placeholder ranges in the response."""

    output_mode: Literal["tokens", "text"] = "tokens"
    """``tokens``: token ids only (the token-in/token-out contract); ``text``: the answer
    (``GenerateTextResponse``) also carries each choice's detokenized text, and its logprobs
    the decoded tokens (needs ``sampling_params.detokenize``, as upstream)."""


class UsageInfo(Struct):
    """Token counts of one request."""

    prompt_tokens: int = 0
    """Tokens in the prompt, placeholders included."""

    total_tokens: int = 0
    """``prompt_tokens + completion_tokens``."""

    completion_tokens: int | None = 0
    """Tokens generated over all choices."""

    prompt_tokens_details: dict[str, Any] | None = None
    """Breakdown such as ``cached_tokens`` when the server reports it."""


class TokenLogprob(Struct, omit_defaults=True):
    """One candidate token and its log-probability."""

    token_id: int
    """The candidate's token id."""

    logprob: float
    """Natural-log probability under the sampling distribution (-inf allowed as -9999.0)."""

    rank: int | None = None
    """1-based rank among the vocabulary at this position."""


class TokenLogprobContent(Struct, omit_defaults=True):
    """The sampled token at one position and its top-k alternatives."""

    token_id: int
    """The sampled token id."""

    logprob: float
    """Its log-probability."""

    rank: int | None = None
    """Its 1-based rank."""

    top_logprobs: list[TokenLogprob] = []
    """The top ``logprobs`` candidates, sampled token first, then by rank."""


class ChoiceLogprobs(Struct):
    """Logprobs of one choice, one entry per generated token."""

    content: list[TokenLogprobContent] | None = None
    """Per generated token; null when logprobs were not requested."""


class PromptLogprob(Struct, omit_defaults=True):
    """A prompt token candidate's log-probability (``prompt_logprobs`` entries)."""

    logprob: float
    """Natural-log probability."""

    rank: int | None = None
    """1-based rank."""

    decoded_token: str | None = None
    """Always null on the token path (no tokenizer on the generate node)."""


class WeightVersionSpan(Struct):
    """Output tokens ``[start, end)`` were sampled by the weights labelled ``version``
    (upstream's ``vllm.outputs.WeightVersionSpan``)."""

    version: str
    """The label given at ``/finish_weight_update`` or ``/update_weight_version``
    (``default`` until one is set)."""

    start: NonNegInt
    """First output-token index (inclusive)."""

    end: NonNegInt
    """Last output-token index (exclusive)."""


class GenerateChoice(Struct):
    """One completed sample (``n`` of them per request)."""

    index: int
    """Sample index, 0 to ``n - 1``."""

    token_ids: list[int] | None = None
    """Generated token ids."""

    logprobs: ChoiceLogprobs | None = None
    """Per-token logprobs when requested."""

    finish_reason: str | None = "stop"
    """``stop`` (EOS or stop condition), ``length`` (max_tokens) or ``abort``."""

    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the sample; null on EOS/length."""

    weight_versions: list[WeightVersionSpan] | None = None
    """Which weights sampled which output tokens (several spans when the weights changed
    mid-sample, e.g. across a ``keep`` pause); null when the engine reported none."""


class GenerateResponse(Struct):
    """The non-streaming answer of ``POST /inference/v1/generate`` in ``tokens`` mode."""

    request_id: str
    """The request's id (echoed)."""

    choices: list[GenerateChoice]
    """One per sample."""

    model: str | None = None
    """Served model name."""

    created: int | None = None
    """Unix time (seconds) the response was made."""

    usage: UsageInfo | None = None
    """Token counts."""

    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None
    """Per prompt position, candidates keyed by token id (as a string, JSON keys being text);
    the first position is null. Present when ``sampling_params.prompt_logprobs`` was set."""

    prompt_token_ids: list[int] | None = None
    """The prompt's token ids when ``return_token_ids`` was set."""

    mm_placeholders: dict[str, list[PlaceholderRange]] | None = None
    """Placeholder ranges when ``return_token_ids`` was set."""

    kv_transfer_params: dict[str, Any] | None = None
    """Passed through from the engine for disaggregated prefill."""

    output_mode: Literal["tokens"] = "tokens"
    """Always ``tokens`` here."""


class GenerateStreamChoice(Struct):
    """New tokens of one sample since the previous chunk."""

    index: int
    """Sample index."""

    token_ids: list[int] | None = None
    """Token ids generated since the previous chunk of this sample."""

    logprobs: ChoiceLogprobs | None = None
    """Logprobs of those tokens when requested."""

    finish_reason: str | None = None
    """Set on the sample's last chunk."""

    stop_reason: int | str | None = None
    """As in ``GenerateChoice``."""

    weight_versions: list[WeightVersionSpan] | None = None
    """On the sample's last chunk only, covering its whole output; null on the others."""


class GenerateStreamResponse(Struct):
    """One server-sent event of a streaming generate (``data: {...}``)."""

    request_id: str
    """The request's id (echoed)."""

    choices: list[GenerateStreamChoice]
    """Samples with news in this chunk (empty on a usage-only chunk)."""

    usage: UsageInfo | None = None
    """Token counts, on the last chunk when ``stream_options.include_usage``."""

    prompt_token_ids: list[int] | None = None
    """First chunk only, when ``return_token_ids`` was set."""

    mm_placeholders: dict[str, list[PlaceholderRange]] | None = None
    """First chunk only, when ``return_token_ids`` was set."""

    output_mode: Literal["tokens"] = "tokens"
    """Always ``tokens`` here."""


class TextLogprob(Struct):
    """A candidate token as text (vLLM's ``ChatCompletionLogProb``)."""

    token: str
    """The token decoded as vLLM's engine decodes it."""

    logprob: float = -9999.0
    """Its log-probability (-inf and NaN as -9999.0)."""

    bytes: list[int] | None = None
    """The token's UTF-8 bytes."""


class TextLogprobContent(TextLogprob):
    """The sampled token at one position and its top-k candidates, as text."""

    top_logprobs: list[TextLogprob] = []
    """The top ``logprobs`` candidates in engine order: the sampled token first."""


class TextLogprobs(Struct):
    """Logprobs of one choice in ``text`` mode (vLLM's ``ChatCompletionLogProbs``)."""

    content: list[TextLogprobContent] | None = None
    """Per generated token."""


class GenerateTextChoice(GenerateChoice):
    """One completed sample in ``text`` mode: a ``GenerateChoice`` and its text."""

    logprobs: TextLogprobs | None = None  # type: ignore[assignment]
    """Per-token logprobs with decoded tokens, when requested."""

    text: str = ""
    """The detokenized output (a matched stop string left out unless
    ``include_stop_str_in_output``); ``token_ids`` keeps every generated token."""


class GenerateTextResponse(GenerateResponse):
    """The non-streaming answer in ``text`` mode."""

    choices: list[GenerateTextChoice]  # type: ignore[assignment]
    """One per sample."""

    output_mode: Literal["text"] = "text"  # type: ignore[assignment]
    """Always ``text`` here."""


class GenerateTextStreamChoice(GenerateStreamChoice):
    """New tokens of one sample since the previous chunk, and their text."""

    logprobs: TextLogprobs | None = None  # type: ignore[assignment]
    """Logprobs of those tokens with decoded tokens, when requested."""

    text: str = ""
    """The text delta since the previous chunk of this sample."""


class GenerateTextStreamResponse(GenerateStreamResponse):
    """One server-sent event of a streaming generate in ``text`` mode."""

    choices: list[GenerateTextStreamChoice]  # type: ignore[assignment]
    """Samples with news in this chunk."""

    output_mode: Literal["text"] = "text"  # type: ignore[assignment]
    """Always ``text`` here."""


class ErrorInfo(Struct, omit_defaults=True):
    """What went wrong, for machines (``type``) and people (``message``)."""

    type: str
    """Stable error type, e.g. ``malformed_body``, ``mm_cache_miss``, ``payload_too_large``."""

    message: str
    """Human-readable explanation; never a stack trace or raw input."""

    code: int | None = None
    """The HTTP status code."""

    param: str | None = None
    """The offending request field, when one is to blame."""

    request_id: str | None = None
    """The request's id, for matching server logs."""

    details: dict[str, Any] | None = None
    """Structured extras, e.g. ``{"missing": {"image": ["<hash>", ...]}}`` for a cache miss."""


class ErrorBody(Struct):
    """The body of every 4xx/5xx answer: ``{"error": {"type": ..., "message": ...}}``."""

    error: ErrorInfo
    """The error."""


class StreamFrameKind(enum.IntEnum):
    """What a frame of generate's binary stream carries (its first byte; see
    ``tandem_wire.streams`` for the layout and the media type that asks for it)."""

    EVENT = 1
    """One stream chunk: the document an SSE ``data:`` line carries (a
    ``GenerateStreamResponse``, or its text variant), as one msgpack map."""

    ERROR = 2
    """An ``ErrorBody`` as a msgpack map: the request failed mid-stream. The stream's last
    frame (no ``END`` follows)."""

    END = 3
    """The stream ended whole (SSE's ``data: [DONE]``); no payload. The stream's last frame."""


STREAM_FRAME_HEADER_BYTES = 5
"""A frame's header: its kind (one byte, a ``StreamFrameKind``), then its payload's length in
bytes (unsigned 32-bit, big-endian). The payload follows."""
