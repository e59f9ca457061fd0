"""The render service's error family: each error has an HTTP status and a stable type string."""

from __future__ import annotations

__all__ = [
    "RenderError",
    "BadRequest",
    "Unauthorized",
    "ModelNotFound",
    "PromptTooLong",
    "TokenOutOfVocabulary",
    "TooManyItems",
    "MediaError",
    "MediaSchemeNotAllowed",
    "MediaUrlForbidden",
    "MediaFetchFailed",
    "MediaTooLarge",
    "MediaNotFound",
    "InvalidImage",
    "ImageTooLarge",
    "Overloaded",
]


class RenderError(Exception):
    """Base of every error the render service answers with (never for bugs: those are 500s).

    ``type`` is stable and machine-readable; ``message`` is for people and never carries a
    stack trace or more than a short excerpt of the input.
    """

    status_code: int = 400
    type: str = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(RenderError):
    """The request is well-formed but not acceptable (bad field value, unsupported option)."""


class Unauthorized(RenderError):
    """Missing or wrong API key."""

    status_code = 401
    type = "unauthorized"


class ModelNotFound(RenderError):
    """The request names a model this server does not serve."""

    status_code = 404
    type = "model_not_found"


class PromptTooLong(RenderError):
    """The rendered prompt does not fit the model's context."""

    type = "prompt_too_long"


class TokenOutOfVocabulary(RenderError):
    """A token id given by the caller is outside the tokenizer's vocabulary."""

    type = "token_out_of_vocabulary"


class TooManyItems(RenderError):
    """More images/videos in one prompt than the configured limit."""

    type = "too_many_items"


class MediaError(RenderError):
    """Base of the media-loading failures."""

    type = "invalid_media"


class MediaSchemeNotAllowed(MediaError):
    """The media URL's scheme is not allowed (e.g. ``ftp:``, or ``file:`` without a folder)."""

    type = "media_scheme_not_allowed"


class MediaUrlForbidden(MediaError):
    """The media URL points at a forbidden host: private, loopback, link-local or reserved
    addresses (directly, via DNS, or via a redirect), a domain outside the allowlist, or a local
    file outside the allowed folder."""

    status_code = 403
    type = "media_url_forbidden"


class MediaFetchFailed(MediaError):
    """Fetching remote media failed: timeout, connection error, non-2xx answer, too many
    redirects."""

    status_code = 422
    type = "media_fetch_failed"


class MediaTooLarge(MediaError):
    """The media's bytes exceed the configured size cap."""

    status_code = 413
    type = "media_too_large"


class MediaNotFound(MediaError):
    """A local media file does not exist."""

    type = "media_not_found"


class InvalidImage(MediaError):
    """The bytes are not an image the server can decode."""

    type = "invalid_image"


class ImageTooLarge(MediaError):
    """The image declares more pixels than allowed (decompression-bomb guard), checked before
    decoding."""

    status_code = 413
    type = "image_too_large"


class Overloaded(RenderError):
    """Too many requests are waiting; retry later."""

    status_code = 429
    type = "overloaded"
