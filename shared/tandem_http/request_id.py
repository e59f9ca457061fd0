"""Request ids: take a sane incoming ``x-request-id`` or make one, expose it, echo it back."""

from __future__ import annotations

import re

from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem_wire import new_request_id

__all__ = ["REQUEST_ID_HEADER", "RequestIdMiddleware", "request_id_of"]

REQUEST_ID_HEADER = "x-request-id"

# Ids end up in logs and response headers: a short charset keeps them from forging log lines
# or smuggling header content.
_SANE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_HEADER_BYTES = REQUEST_ID_HEADER.encode("ascii")


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == _HEADER_BYTES:
            text = value.decode("latin-1")
            return text if _SANE_ID.fullmatch(text) else None
    return None


class RequestIdMiddleware:
    """Pure ASGI middleware: sets ``request.state.request_id`` and the ``x-request-id`` header.

    Add it last (outermost) so that other middleware, handlers and error handlers see the id.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope) or new_request_id()
        # Mutated in place, not copied: Starlette's outermost error middleware holds this same
        # scope, so its 500 handler can still find the id.
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id_of(conn: HTTPConnection) -> str:
    """The request's id; made (and remembered) here when RequestIdMiddleware is not installed."""
    rid = getattr(conn.state, "request_id", None)
    if not isinstance(rid, str):
        rid = new_request_id()
        conn.state.request_id = rid
    return rid
