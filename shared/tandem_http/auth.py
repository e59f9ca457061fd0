"""Bearer API-key check for every HTTP request but a few open paths (health probes)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tandem_wire import error_types, format_for_accept, new_request_id

from .errors import error_body
from .request_id import REQUEST_ID_HEADER

__all__ = ["ApiKeyMiddleware"]


class ApiKeyMiddleware:
    """Pure ASGI middleware: requires ``Authorization: Bearer <api_key>`` when a key is set.

    With no key (``None`` or ``""``) every request passes. Paths in ``open_paths`` are matched
    exactly. Add it before RequestIdMiddleware so that 401 answers carry the request id.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        open_paths: Iterable[str] = ("/health",),
    ) -> None:
        self.app = app
        self._key = api_key.encode("utf-8") if api_key else None
        self._open_paths = frozenset(open_paths)

    @staticmethod
    def _authorized(scope: Scope, key: bytes) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # Compared as bytes in constant time, so the answer time leaks nothing of the key.
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._key is None
            or scope["type"] not in ("http", "websocket")
            or scope["path"] in self._open_paths
            or self._authorized(scope, self._key)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        rid = scope.get("state", {}).get("request_id") or new_request_id()
        fmt = format_for_accept(Headers(scope=scope).get("accept"))
        body = error_body(
            fmt,
            status_code=401,
            type=error_types.UNAUTHORIZED,
            message="missing or invalid API key",
            request_id=rid,
        )
        headers = [
            (b"content-type", fmt.content_type.encode("ascii")),
            (b"content-length", str(len(body)).encode("ascii")),
            (b"www-authenticate", b"Bearer"),
            (REQUEST_ID_HEADER.encode("ascii"), rid.encode("ascii")),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
