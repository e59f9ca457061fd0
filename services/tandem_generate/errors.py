"""The generate service's own errors; the errors it shares with render are in tandem_http, the
type strings in tandem_wire.error_types."""

from __future__ import annotations

from typing import Any

from tandem_wire import TandemHTTPError, error_types

__all__ = [
    "GenerateError",
    "CacheMiss",
    "InvalidPlaceholders",
    "InvalidItem",
    "UnsupportedSamplingParams",
    "StructuredOutputsDisabled",
    "StructuredOutputTooLarge",
    "InvalidStructuredOutput",
    "EngineNotReady",
    "InvalidWeightUpdate",
    "WeightPathNotAllowed",
    "WeightUpdateConflict",
    "WeightUpdateIncomplete",
    "WeightUpdateSeqSeen",
    "WeightTransferNotConfigured",
    "WeightCheckpointUnavailable",
    "PrefixCacheNotReset",
    "RenderRefused",
    "RenderUnavailable",
    "RenderFailed",
]


class GenerateError(TandemHTTPError):
    """Base of the errors only the generate service answers with."""


class CacheMiss(GenerateError):
    """Null ``kwargs_data`` entries for items this node does not hold; ``details.missing``
    lists their hashes by modality so the client can resend exactly those."""

    status_code = 409
    type = error_types.MM_CACHE_MISS


class InvalidPlaceholders(GenerateError):
    """Placeholder ranges that do not sit on the model's placeholder tokens, or whose length
    disagrees with what the item's grid implies."""

    type = error_types.INVALID_PLACEHOLDERS


class InvalidItem(GenerateError):
    """A kwargs item with keys, dtypes or layouts this model's processor does not produce."""

    type = error_types.INVALID_MM_ITEM


class UnsupportedSamplingParams(GenerateError):
    """A sampling field that is unknown, not allowed here, or out of range."""

    type = error_types.INVALID_SAMPLING_PARAMS


class StructuredOutputsDisabled(GenerateError):
    """``structured_outputs`` sent to a server started with ``--disable-structured-outputs``."""

    type = error_types.STRUCTURED_OUTPUTS_DISABLED


class StructuredOutputTooLarge(GenerateError):
    """``structured_outputs`` larger, as JSON, than ``--max-structured-output-bytes``."""

    type = error_types.STRUCTURED_OUTPUT_TOO_LARGE


class InvalidStructuredOutput(GenerateError):
    """A schema, regex, grammar, choice list or structural tag vLLM's structured-output backend
    refuses; refused before the engine sees it, so the engine keeps serving."""

    type = error_types.INVALID_STRUCTURED_OUTPUT


class EngineNotReady(GenerateError):
    """The engine is starting or has failed."""

    status_code = 503
    type = error_types.ENGINE_NOT_READY
    retry_after = 5


class InvalidWeightUpdate(GenerateError):
    """An update the model cannot take (unknown name, wrong shape or dtype, part of a layer,
    not a safetensors file); nothing was loaded and the old weights keep serving."""

    type = error_types.INVALID_WEIGHT_UPDATE


class WeightPathNotAllowed(GenerateError):
    """An update path outside the weight-transfer folder, or no folder configured."""

    type = error_types.WEIGHT_PATH_NOT_ALLOWED


class WeightUpdateConflict(GenerateError):
    """A weight-update call out of order (as vLLM's worker refuses it)."""

    status_code = 409
    type = error_types.WEIGHT_UPDATE_CONFLICT


class WeightUpdateSeqSeen(GenerateError):
    """A start whose update id's SEQ this node has already seen start (a router minted it
    from a stale count): nothing started."""

    status_code = 409
    type = error_types.WEIGHT_UPDATE_SEQ_SEEN


class WeightUpdateIncomplete(GenerateError):
    """A finish whose caller sent other chunks than this node took (one was lost on the way):
    the update was ended here without loading it."""

    status_code = 409
    type = error_types.WEIGHT_UPDATE_INCOMPLETE


class WeightTransferNotConfigured(GenerateError):
    """Weight-transfer calls on a server with no ``--weight-transfer-config``."""

    status_code = 409
    type = error_types.WEIGHT_TRANSFER_NOT_CONFIGURED


class WeightCheckpointUnavailable(GenerateError):
    """The served model's checkpoint, which every update is checked against, cannot be read
    on this node (not in the local files, or a header it cannot read)."""

    status_code = 409
    type = error_types.WEIGHT_CHECKPOINT_UNAVAILABLE


class PrefixCacheNotReset(GenerateError):
    """The new weights are loaded, but the engine refused to reset its prefix cache."""

    status_code = 503
    type = error_types.PREFIX_CACHE_NOT_RESET
    retry_after = 1


class RenderRefused(GenerateError):
    """The render node that resolves ``content_parts`` refused them (a media URL it may not
    fetch, an image it cannot decode, token ids that do not match the media, ...): its status
    and ``type`` are passed on, so the caller sees what render itself would answer."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        type: str,
        param: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, details=details, retry_after=retry_after)
        self.status_code = status_code
        self.type = type


class RenderUnavailable(GenerateError):
    """The render node that resolves ``content_parts`` cannot be reached, timed out, or is
    not ready (it answered 503); nothing was generated."""

    status_code = 503
    type = error_types.UPSTREAM_UNAVAILABLE
    retry_after = 1


class RenderFailed(GenerateError):
    """The render node that resolves ``content_parts`` failed (a 5xx other than 503) or
    refused this node's own key; nothing was generated."""

    status_code = 502
    type = error_types.UPSTREAM_ERROR
