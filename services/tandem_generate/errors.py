"""The generate service's error family: each error has an HTTP status and a stable type string."""

from __future__ import annotations

from typing import Any

__all__ = [
    "GenerateError",
    "BadRequest",
    "ModelNotFound",
    "CacheMiss",
    "InvalidPlaceholders",
    "InvalidItem",
    "TokenOutOfVocabulary",
    "PromptTooLong",
    "TooManyItems",
    "UnsupportedSamplingParams",
    "Overloaded",
    "EngineNotReady",
]


class GenerateError(Exception):
    """Base of every error the generate service answers with (bugs are 500s instead)."""

    status_code: int = 400
    type: str = "invalid_request"

    def __init__(
        self, message: str, *, param: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.details = details


class BadRequest(GenerateError):
    """A field value this service cannot accept."""


class ModelNotFound(GenerateError):
    """``model`` names a model this server does not serve."""

    status_code = 404
    type = "model_not_found"


class CacheMiss(GenerateError):
    """Null ``kwargs_data`` entries for items this node does not hold; ``details.missing``
    lists their hashes by modality so the client can resend exactly those."""

    status_code = 409
    type = "mm_cache_miss"


class InvalidPlaceholders(GenerateError):
    """Placeholder ranges that do not sit on the model's placeholder tokens, or whose length
    disagrees with what the item's grid implies."""

    type = "invalid_placeholders"


class InvalidItem(GenerateError):
    """A kwargs item with keys, dtypes or layouts this model's processor does not produce."""

    type = "invalid_mm_item"


class TokenOutOfVocabulary(GenerateError):
    """A token id outside the model's vocabulary."""

    type = "token_out_of_vocabulary"


class PromptTooLong(GenerateError):
    """The prompt plus ``max_tokens`` do not fit the context."""

    type = "prompt_too_long"


class TooManyItems(GenerateError):
    """More items in one prompt than the configured limit."""

    type = "too_many_items"


class UnsupportedSamplingParams(GenerateError):
    """A sampling field that is unknown, not allowed here, or out of range."""

    type = "invalid_sampling_params"


class Overloaded(GenerateError):
    """Too many requests waiting for the engine; retry later."""

    status_code = 429
    type = "overloaded"
    retry_after = 1


class EngineNotReady(GenerateError):
    """The engine is starting or has failed."""

    status_code = 503
    type = "engine_not_ready"
    retry_after = 5
