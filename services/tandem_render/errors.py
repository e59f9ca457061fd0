"""The render service's own errors (media loading); the errors it shares with generate are in
tandem_http, the type strings in tandem_wire.error_types."""

from __future__ import annotations

from tandem_wire import TandemHTTPError, error_types

__all__ = [
    "RenderError",
    "MediaError",
    "MediaSchemeNotAllowed",
    "MediaUrlForbidden",
    "MediaFetchFailed",
    "MediaTooLarge",
    "MediaNotFound",
    "InvalidImage",
    "ImageTooLarge",
    "InvalidEmbeds",
]


class RenderError(TandemHTTPError):
    """Base of the errors only the render service answers with."""


class MediaError(RenderError):
    """Base of the media-loading failures (raised itself for a malformed media URL)."""

    type = error_types.INVALID_MEDIA


class MediaSchemeNotAllowed(MediaError):
    """The media URL's scheme is not allowed (e.g. ``ftp:``, or ``file:`` without a folder)."""

    type = error_types.MEDIA_SCHEME_NOT_ALLOWED


class MediaUrlForbidden(MediaError):
    """The media URL points at a forbidden host: private, loopback, link-local or reserved
    addresses (directly, via DNS, or via a redirect), a domain outside the allowlist, or a local
    file outside the allowed folder."""

    status_code = 403
    type = error_types.MEDIA_URL_FORBIDDEN


class MediaFetchFailed(MediaError):
    """Fetching remote media failed: timeout, connection error, non-2xx answer, too many
    redirects."""

    status_code = 422
    type = error_types.MEDIA_FETCH_FAILED


class MediaTooLarge(MediaError):
    """The media's bytes exceed the configured size cap."""

    status_code = 413
    type = error_types.MEDIA_TOO_LARGE


class MediaNotFound(MediaError):
    """A local media file does not exist."""

    type = error_types.MEDIA_NOT_FOUND


class InvalidImage(MediaError):
    """The bytes are not an image the server can decode."""

    type = error_types.INVALID_IMAGE


class ImageTooLarge(MediaError):
    """The image declares more pixels than allowed (decompression-bomb guard), checked before
    decoding."""

    status_code = 413
    type = error_types.IMAGE_TOO_LARGE


class InvalidEmbeds(RenderError):
    """An ``image_embeds`` content part whose tensors do not fit the model: names, dtype, hidden
    size, rows against the grid, or a grid the model's merge size cannot take."""

    type = error_types.INVALID_MM_EMBEDS
