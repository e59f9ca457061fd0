"""The WireError family: every way untrusted wire bytes can be refused, each with a stable type."""

from __future__ import annotations

__all__ = [
    "WireError",
    "MalformedBody",
    "MalformedBase64",
    "InvalidDocument",
    "UnsupportedExtType",
    "UnsupportedDtype",
    "ShapeMismatch",
    "InvalidFieldLayout",
    "InvalidTensorData",
    "NestingTooDeep",
    "PayloadTooLarge",
]


class WireError(ValueError):
    """Base of every decode/validation failure in tandem_wire.

    ``type`` is a stable machine-readable string that services put in the error body;
    ``status_code`` is the HTTP status a service answers with. Messages never quote raw
    input bytes, only sizes, names and positions.
    """

    type: str = "invalid_wire_data"
    status_code: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedBody(WireError):
    """The body is not well-formed JSON or msgpack."""

    type = "malformed_body"


class MalformedBase64(WireError):
    """A base64 string (a JSON-mode kwargs item) is not valid base64."""

    type = "malformed_base64"


class InvalidDocument(WireError):
    """The body parses but does not match the schema (missing field, wrong type, bad value)."""

    type = "invalid_request"


class UnsupportedExtType(WireError):
    """A msgpack extension other than raw tensor bytes (code 3); pickle's codes 1/2 land here."""

    type = "unsupported_ext_type"


class UnsupportedDtype(WireError):
    """A tensor dtype string outside the allowlist."""

    type = "unsupported_dtype"


class ShapeMismatch(WireError):
    """A tensor's shape does not agree with its byte count, or is not a valid shape."""

    type = "shape_mismatch"


class InvalidFieldLayout(WireError):
    """A field layout (``[factory, kwargs]``) that is not batched/flat/shared or is malformed."""

    type = "invalid_field_layout"


class InvalidTensorData(WireError):
    """Tensor data of the wrong form: not ``[dtype, shape, Ext(3, bytes)]``, or not nested lists."""

    type = "invalid_tensor_data"


class NestingTooDeep(WireError):
    """Nested lists deeper than the configured limit."""

    type = "nesting_too_deep"


class PayloadTooLarge(WireError):
    """A size limit (bytes, tensors, dimensions, items) was exceeded before allocating."""

    type = "payload_too_large"
    status_code = 413
