"""Request bodies with a size cap, content negotiation, and wire-encoded responses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tandem_wire import (
    PayloadTooLarge,
    WireFormat,
    encode_document,
    format_for_accept,
    format_of_content_type,
)

__all__ = ["BodyTooLarge", "PartsResponse", "negotiate", "read_body", "wire_response"]


class BodyTooLarge(PayloadTooLarge):
    """The request body exceeds the route's byte limit (413 ``payload_too_large``).

    A WireError, so the handler every service installs for WireError renders it.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"request body exceeds {max_bytes} bytes")
        self.max_bytes = max_bytes


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refusing more than ``max_bytes`` without buffering the excess.

    Content-Length is checked before reading; chunked or lying bodies are cut off as soon as
    the running total passes the limit.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise BodyTooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def negotiate(request: Request) -> tuple[WireFormat, WireFormat]:
    """(request body format from Content-Type, response format from Accept).

    Raises tandem_wire.InvalidDocument (400 ``invalid_request``) for an unknown Content-Type.
    """
    headers = request.headers
    return format_of_content_type(headers.get("content-type")), format_for_accept(
        headers.get("accept")
    )


def wire_response(
    obj: Any,
    fmt: WireFormat,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A Response holding ``obj`` (a msgspec Struct, list or dict) encoded in ``fmt``."""
    return Response(encode_document(obj, fmt), status_code, headers, media_type=fmt.content_type)


class PartsResponse(Response):
    """A response whose body is a list of byte pieces, sent one after the other.

    For answers holding megabytes of base64 (``encode_generate_request_parts``): joining the
    pieces first would copy all of them once more for nothing.
    """

    def __init__(
        self, parts: Sequence[bytes], status_code: int = 200, media_type: str | None = None
    ) -> None:
        self.parts = [p for p in parts if p] or [b""]
        self.length = sum(map(len, self.parts))
        super().__init__(None, status_code, {"content-length": str(self.length)}, media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})
