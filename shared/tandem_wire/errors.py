"""The error base every Tandem service answers with, and the WireError family: every way
untrusted wire bytes can be refused, each with a stable type."""

from __future__ import annotations

from typing import Any

from . import error_types

__all__ = [
    "TandemHTTPError",
    "WireError",
    "MalformedBody",
    "MalformedBase64",
    "MalformedFrame",
    "InvalidDocument",
    "UnsupportedExtType",
    "UnsupportedDtype",
    "ShapeMismatch",
    "InvalidFieldLayout",
    "InvalidTensorData",
    "NestingTooDeep",
    "PayloadTooLarge",
    "UnsupportedWireTransform",
    "UnsupportedContentEncoding",
]


class TandemHTTPError(Exception):
    """Base of every error a Tandem service answers with (never for bugs: those are 500s).

    Rendered by tandem_http as ``{"error": {"type", "message", "code", "param", "details"}}``
    with ``status_code`` as the HTTP status, and mapped back by the client from ``type`` (one of
    ``tandem_wire.error_types``). ``message`` is for people: it never carries a stack trace or
    raw input bytes, only sizes, names and short excerpts. ``retry_after`` (seconds) becomes a
    ``Retry-After`` header on 429 and 503 answers.

    Pure Python, so the wire codec can raise it without a web framework.
    """

    status_code: int = 400
    type: str = error_types.INVALID_REQUEST
    retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.details = details
        if retry_after is not None:
            self.retry_after = retry_after


class WireError(TandemHTTPError, ValueError):
    """Base of every decode/validation failure in tandem_wire (a ValueError too)."""


class MalformedBody(WireError):
    """The body is not well-formed JSON or msgpack."""

    type = error_types.MALFORMED_BODY


class MalformedFrame(WireError):
    """A frame of generate's binary stream (``tandem_wire.streams``) that is cut short, of an
    unknown kind, past its stream's end, or whose payload does not decode as its kind says."""

    type = error_types.MALFORMED_STREAM_FRAME


class MalformedBase64(WireError):
    """A base64 string (a JSON-mode kwargs item) is not valid base64."""

    type = error_types.MALFORMED_BASE64


class InvalidDocument(WireError):
    """The body parses but does not match the schema (missing field, wrong type, bad value)."""

    type = error_types.INVALID_REQUEST


class UnsupportedExtType(WireError):
    """A msgpack extension other than raw tensor bytes (code 3); pickle's codes 1/2 land here."""

    type = error_types.UNSUPPORTED_EXT_TYPE


class UnsupportedDtype(WireError):
    """A tensor dtype string outside the allowlist."""

    type = error_types.UNSUPPORTED_DTYPE


class ShapeMismatch(WireError):
    """A tensor's shape does not agree with its byte count, or is not a valid shape."""

    type = error_types.SHAPE_MISMATCH


class InvalidFieldLayout(WireError):
    """A field layout (``[factory, kwargs]``) that is not batched/flat/shared or is malformed."""

    type = error_types.INVALID_FIELD_LAYOUT


class InvalidTensorData(WireError):
    """Tensor data of the wrong form: not ``[dtype, shape, Ext(3, bytes)]``, or not nested lists."""

    type = error_types.INVALID_TENSOR_DATA


class NestingTooDeep(WireError):
    """Nested lists deeper than the configured limit."""

    type = error_types.NESTING_TOO_DEEP


class UnsupportedWireTransform(WireError):
    """A field declares a wire transform this receiver does not apply: refused, never guessed
    (its data is not the processor's tensor until the transform is undone)."""

    type = error_types.UNSUPPORTED_WIRE_TRANSFORM


class UnsupportedContentEncoding(WireError):
    """A body sent with a ``Content-Encoding`` this receiver does not decode (415; the answer's
    ``Accept-Encoding`` names what it does). The body was not read as a document."""

    type = error_types.UNSUPPORTED_CONTENT_ENCODING
    status_code = 415


class PayloadTooLarge(WireError):
    """A size limit (bytes, tensors, dimensions, items) was exceeded before allocating."""

    type = error_types.PAYLOAD_TOO_LARGE
    status_code = 413
