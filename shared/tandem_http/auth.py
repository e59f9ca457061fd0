"""Bearer API-key check for every HTTP request but a few open paths (health probes)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tandem_wire import error_types

from .errors import send_error

__all__ = ["ApiKeyMiddleware", "api_keys", "principal_of"]

_PRINCIPAL = "tandem_principal"


def principal_of(scope_or_request: Any) -> str:
    """Which API key a request was let in with: a digest of it (never the key), or "" when the
    server has no keys. Services scope what callers leave behind (held items) by it."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    return str(scope.get("state", {}).get(_PRINCIPAL, ""))


def api_keys(api_key: str | Sequence[str] | None) -> list[str]:
    """The keys a setting configures (one, several, or none; empty strings are no key)."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    return [k for k in keys if k]


class ApiKeyMiddleware:
    """Pure ASGI middleware: requires ``Authorization: Bearer <key>`` with one of the keys when
    any is set, and records which one (``principal_of``).

    With no key (``None``, ``""`` or no keys) every request passes. Paths in ``open_paths`` are
    matched exactly. Add it before RequestIdMiddleware so that 401 answers carry the request id.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | Sequence[str] | None,
        open_paths: Iterable[str] = ("/health",),
    ) -> None:
        self.app = app
        self._keys = [(k.encode("utf-8"), _digest(k)) for k in api_keys(api_key)]
        self._open_paths = frozenset(open_paths)

    def _principal(self, scope: Scope) -> str | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return None
                found = None
                # Every key compared as bytes in constant time, so the answer time leaks
                # nothing of the keys nor of which one matched.
                for key, principal in self._keys:
                    if hmac.compare_digest(token.strip(), key):
                        found = principal
                return found
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._keys or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        principal = self._principal(scope)
        if principal is not None or scope["path"] in self._open_paths:
            if principal is not None:
                scope.setdefault("state", {})[_PRINCIPAL] = principal
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        await send_error(
            scope,
            send,
            status_code=401,
            type=error_types.UNAUTHORIZED,
            message="missing or invalid API key",
            headers={"www-authenticate": "Bearer"},
        )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
