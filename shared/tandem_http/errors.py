"""Tandem's errors over HTTP, in one place: the errors every service shares, and the handlers
that turn any exception into the error body ``{"error": {"type", "message", ...}}``.

The base, ``tandem_wire.TandemHTTPError``, lives in the wire library so that the codec's
WireError is one too; the ``type`` strings live in ``tandem_wire.error_types``. A service keeps
only the errors that are its own (a subclass of its package base, itself a TandemHTTPError).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, cast

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope, Send

from tandem_wire import (
    ErrorBody,
    ErrorInfo,
    TandemHTTPError,
    WireFormat,
    encode_document,
    error_types,
    format_for_accept,
    new_request_id,
)

from .request_id import REQUEST_ID_HEADER, request_id_of

__all__ = [
    "AdminRequired",
    "BadRequest",
    "BodyTimeout",
    "ControlRoutesDisabled",
    "MmEmbedsDisabled",
    "ModelNotFound",
    "Overloaded",
    "PromptTooLong",
    "TokenOutOfVocabulary",
    "TooManyItems",
    "VllmBadRequest",
    "error_body",
    "error_response",
    "install_error_handlers",
    "send_error",
]

logger = logging.getLogger("tandem")


class BadRequest(TandemHTTPError):
    """The request is well-formed but not acceptable (bad field value, unsupported option)."""


class ModelNotFound(TandemHTTPError):
    """``model`` names a model this server does not serve."""

    status_code = 404
    type = error_types.MODEL_NOT_FOUND


class PromptTooLong(TandemHTTPError):
    """The prompt (on generate: plus ``max_tokens``) does not fit the model's context."""

    type = error_types.PROMPT_TOO_LONG


class TokenOutOfVocabulary(TandemHTTPError):
    """A token id given by the caller is outside the model's vocabulary."""

    type = error_types.TOKEN_OUT_OF_VOCABULARY


class TooManyItems(TandemHTTPError):
    """More images/videos in one prompt than the configured limit."""

    type = error_types.TOO_MANY_ITEMS


class VllmBadRequest(BadRequest):
    """A request one of vLLM's own rules refuses (past the model's item limit, say), answered
    as ``vllm serve`` answers it: its message, its ``param`` and its type."""

    type = error_types.BAD_REQUEST_ERROR


class MmEmbedsDisabled(TandemHTTPError):
    """Precomputed embeddings sent to a server started without ``--enable-mm-embeds`` (on
    render, an ``image_embeds`` content part; on generate, an item carrying embeddings)."""

    type = error_types.MM_EMBEDS_DISABLED


class Overloaded(TandemHTTPError):
    """Too many requests are waiting; retry later (after ``retry_after`` seconds when given)."""

    status_code = 429
    type = error_types.OVERLOADED


class BodyTimeout(TandemHTTPError):
    """The request body stalled or trickled past the server's deadline (``BodyDeadline``):
    the request is dropped unrun and its admission slot freed; the connection is closed."""

    status_code = 408
    type = error_types.BODY_TIMEOUT


class AdminRequired(TandemHTTPError):
    """A route that changes engine state (pause, abort, weight updates, cache reset) called
    with an inference key: it needs an admin key (``--admin-api-key``); nothing was done."""

    status_code = 403
    type = error_types.ADMIN_REQUIRED


class ControlRoutesDisabled(TandemHTTPError):
    """A route that changes engine state on a server with no key at all: refused unless the
    operator passed ``--enable-control-routes``."""

    status_code = 403
    type = error_types.CONTROL_ROUTES_DISABLED


_HTTP_TYPES = {
    400: error_types.INVALID_REQUEST,
    401: error_types.UNAUTHORIZED,
    403: error_types.FORBIDDEN,
    404: error_types.NOT_FOUND,
    405: error_types.METHOD_NOT_ALLOWED,
    413: error_types.PAYLOAD_TOO_LARGE,
    415: error_types.UNSUPPORTED_MEDIA_TYPE,
    429: error_types.OVERLOADED,
    503: error_types.UNAVAILABLE,
}
_BODY_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_MAX_MESSAGE = 200


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


async def send_error(
    scope: Scope,
    send: Send,
    *,
    status_code: int,
    type: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Answer a typed error from pure ASGI code (a middleware in front of the app), in the
    format the client's Accept asks for, with ``x-request-id``."""
    rid = scope.get("state", {}).get("request_id") or new_request_id()
    fmt = format_for_accept(Headers(scope=scope).get("accept"))
    body = error_body(fmt, status_code=status_code, type=type, message=message, request_id=rid)
    raw = [
        (b"content-type", fmt.content_type.encode("ascii")),
        (b"content-length", str(len(body)).encode("ascii")),
        *((k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()),
        (REQUEST_ID_HEADER.encode("ascii"), rid.encode("ascii")),
    ]
    await send({"type": "http.response.start", "status": status_code, "headers": raw})
    await send({"type": "http.response.body", "body": body})


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
    exc = cast(TandemHTTPError, exc)  # registered for TandemHTTPError (and subclasses) only
    status = exc.status_code
    headers: dict[str, str] = {}
    if status in (429, 503) and exc.retry_after is not None:
        headers["Retry-After"] = str(max(0, math.ceil(exc.retry_after)))
    if status == 408:
        # RFC 9110 15.5.9: the rest of the body may still come; the connection is not reused.
        headers["Connection"] = "close"
    if status >= 500:
        logger.warning("%s (request id %s): %s", exc.type, request_id_of(request), exc.message)
    return error_response(
        request,
        status_code=status,
        type=exc.type,
        message=exc.message,
        param=exc.param,
        details=exc.details,
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
        request,
        status_code=400,
        type=error_types.INVALID_REQUEST,
        message=message,
        param=param,
    )


async def _handle_http(request: Request, exc: Exception) -> Response:
    exc = cast(StarletteHTTPException, exc)  # registered for this class only
    status = exc.status_code
    fallback = error_types.INTERNAL_ERROR if status >= 500 else error_types.HTTP_ERROR
    type_ = _HTTP_TYPES.get(status, fallback)
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
        type=error_types.INTERNAL_ERROR,
        message=f"internal error (request id {rid})",
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the error handlers: every TandemHTTPError (service errors, shared errors and
    WireError alike; Starlette looks handlers up along the exception's MRO) with its own status
    and type, validation errors (400), routing HTTPExceptions (404/405...) and a catch-all 500.
    """
    app.add_exception_handler(TandemHTTPError, _handle_known)
    app.add_exception_handler(RequestValidationError, _handle_validation)
    app.add_exception_handler(StarletteHTTPException, _handle_http)
    app.add_exception_handler(Exception, _handle_unexpected)
