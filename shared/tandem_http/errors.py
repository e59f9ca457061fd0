"""One place that turns exceptions into Tandem's error body: ``{"error": {"type", "message"}}``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol, cast

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from tandem_wire import (
    ErrorBody,
    ErrorInfo,
    WireError,
    WireFormat,
    encode_document,
    format_for_accept,
)

from .request_id import REQUEST_ID_HEADER, request_id_of

__all__ = ["HTTPErrorLike", "error_body", "error_response", "install_error_handlers"]

logger = logging.getLogger("tandem")

_HTTP_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "overloaded",
    503: "unavailable",
}
_BODY_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_MAX_MESSAGE = 200


class HTTPErrorLike(Protocol):
    """What a service error class provides (``param``, ``details``, ``retry_after`` optional)."""

    status_code: int
    type: str
    message: str


def error_body(
    fmt: WireFormat,
    *,
    status_code: int,
    type: str,
    message: str,
    request_id: str,
    param: str | None = None,
    details: dict[str, Any] | None = None,
) -> bytes:
    """The encoded ``ErrorBody`` (for pure ASGI code that has no Request)."""
    info = ErrorInfo(
        type=type,
        message=message,
        code=status_code,
        param=param,
        request_id=request_id,
        details=details,
    )
    return encode_document(ErrorBody(info), fmt)


def error_response(
    request: Request,
    *,
    status_code: int,
    type: str,
    message: str,
    param: str | None = None,
    details: dict[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error Response in the format the client's Accept asks for, with ``x-request-id``."""
    rid = request_id_of(request)
    fmt = format_for_accept(request.headers.get("accept"))
    body = error_body(
        fmt,
        status_code=status_code,
        type=type,
        message=message,
        request_id=rid,
        param=param,
        details=details,
    )
    # Set here too, not only by RequestIdMiddleware: Starlette's 500 handler sends its response
    # from outside every user middleware.
    all_headers = {**(headers or {}), REQUEST_ID_HEADER: rid}
    return Response(body, status_code, all_headers, media_type=fmt.content_type)


async def _handle_known(request: Request, exc: Exception) -> Response:
    status = int(getattr(exc, "status_code", 500))
    type_ = str(getattr(exc, "type", "internal_error"))
    message = getattr(exc, "message", None)
    # Service errors are written to be shown; str() is only a fallback for a class lacking one.
    message = message if isinstance(message, str) else str(exc)
    headers: dict[str, str] = {}
    retry_after = getattr(exc, "retry_after", None)
    if status in (429, 503) and isinstance(retry_after, (int, float)):
        headers["Retry-After"] = str(max(0, math.ceil(retry_after)))
    if status >= 500:
        logger.warning("%s (request id %s): %s", type_, request_id_of(request), message)
    return error_response(
        request,
        status_code=status,
        type=type_,
        message=message,
        param=getattr(exc, "param", None),
        details=getattr(exc, "details", None),
        headers=headers,
    )


def _validation_summary(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    if loc and loc[0] in _BODY_LOCATIONS:
        loc = loc[1:]
    param = ".".join(loc) or None
    # Pydantic's "msg" describes the expectation; its "input" (the caller's data) is left out.
    message = str(first.get("msg", "invalid value"))
    if param:
        message = f"{param}: {message}"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return message, param


async def _handle_validation(request: Request, exc: Exception) -> Response:
    # Registered for RequestValidationError only.
    message, param = _validation_summary(cast(RequestValidationError, exc))
    return error_response(
        request, status_code=400, type="invalid_request", message=message, param=param
    )


async def _handle_http(request: Request, exc: Exception) -> Response:
    exc = cast(StarletteHTTPException, exc)  # registered for this class only
    status = exc.status_code
    type_ = _HTTP_TYPES.get(status, "internal_error" if status >= 500 else "http_error")
    message = exc.detail if isinstance(exc.detail, str) else type_.replace("_", " ")
    return error_response(
        request, status_code=status, type=type_, message=message, headers=exc.headers
    )


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    rid = request_id_of(request)
    # The traceback goes to the log under the request id; the body says nothing of the bug.
    # (Starlette re-raises after this response, so uvicorn logs the exception as well.)
    logger.error(
        "internal error (request id %s) in %s %r",
        rid,
        request.method,
        request.url.path,
        exc_info=exc,
    )
    return error_response(
        request,
        status_code=500,
        type="internal_error",
        message=f"internal error (request id {rid})",
    )


def install_error_handlers(app: FastAPI, handled: tuple[type[Exception], ...]) -> None:
    """Register the error handlers: one per class in ``handled`` (plus WireError), validation
    errors (400), routing HTTPExceptions (404/405...) and a catch-all 500.

    Each class in ``handled`` follows HTTPErrorLike; its subclasses are rendered by the same
    handler (Starlette looks handlers up along the exception's MRO).
    """
    for cls in dict.fromkeys((*handled, WireError)):
        app.add_exception_handler(cls, _handle_known)
    app.add_exception_handler(RequestValidationError, _handle_validation)
    app.add_exception_handler(StarletteHTTPException, _handle_http)
    app.add_exception_handler(Exception, _handle_unexpected)
