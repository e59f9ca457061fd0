"""Bearer API-key check for every HTTP request but a few open paths (health probes), and who
may change engine state (admin keys)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tandem_wire import error_types

from .errors import AdminRequired, ControlRoutesDisabled, send_error

__all__ = [
    "ADMIN_KEY_ENV",
    "TENANT_HEADER",
    "ApiKeyMiddleware",
    "ControlAccess",
    "api_keys",
    "is_admin",
    "keys_from_env",
    "principal_of",
]

_PRINCIPAL = "tandem_principal"
_ADMIN = "tandem_admin"

TENANT_HEADER = "x-tandem-tenant"
"""Set by a front door on what it sends a node: the digest of the key its caller was let in
with (``principal_of`` at the door). A node takes it only from a key it was told is a door's
(``ApiKeyMiddleware``'s ``proxy_key``), so tenants behind one door keep apart what they leave
on the node (held items) as if each had called it with its own key."""

ADMIN_KEY_ENV = "TANDEM_ADMIN_API_KEY"
"""Environment variable with the admin keys when no ``--admin-api-key`` is given (several:
comma-separated)."""


def principal_of(scope_or_request: Any) -> str:
    """Which API key a request was let in with: a digest of it (never the key), or "" when the
    server has no keys. Services scope what callers leave behind (held items) by it."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    return str(scope.get("state", {}).get(_PRINCIPAL, ""))


def is_admin(scope_or_request: Any) -> bool:
    """Whether a request was let in with an admin key (``ApiKeyMiddleware``'s ``admin_key``)."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    return bool(scope.get("state", {}).get(_ADMIN, False))


def api_keys(api_key: str | Sequence[str] | None) -> list[str]:
    """The keys a setting configures (one, several, or none; empty strings are no key)."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    return [k for k in keys if k]


def keys_from_env(text: str | None) -> tuple[str, ...]:
    """Keys from an environment variable: comma-separated, blanks around each dropped."""
    return tuple(k.strip() for k in (text or "").split(",") if k.strip())


class ApiKeyMiddleware:
    """Pure ASGI middleware: requires ``Authorization: Bearer <key>`` with one of the keys when
    any is set, and records which one (``principal_of``) and whether it is an admin key
    (``is_admin``).

    ``api_key`` are the inference keys, ``admin_key`` the admin keys: an admin key passes
    wherever an inference key does (an admin may also run inference). With admin keys only,
    inference stays open to every caller (as with no key at all); routes that change engine
    state check ``ControlAccess``. With no key (``None``, ``""`` or no keys) every request
    passes. Paths in ``open_paths`` are matched exactly. Add it before RequestIdMiddleware so
    that 401 answers carry the request id.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | Sequence[str] | None,
        open_paths: Iterable[str] = ("/health",),
        admin_key: str | Sequence[str] | None = None,
        proxy_key: str | Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._keys = [(k.encode("utf-8"), _digest(k), False) for k in api_keys(api_key)]
        self._keys += [(k.encode("utf-8"), _digest(k), True) for k in api_keys(admin_key)]
        self._open = not api_keys(api_key)
        self._open_paths = frozenset(open_paths)
        self._proxies = frozenset(_digest(k) for k in api_keys(proxy_key))
        """Principals of front doors: their ``TENANT_HEADER`` names the caller (``proxy_key``,
        keys that must also be among the inference or admin keys)."""

    def _principal(self, scope: Scope) -> tuple[str, bool] | None:
        found = self._key_principal(scope)
        if found is None or found[0] not in self._proxies:
            return found
        for name, value in scope.get("headers", ()):
            if name == TENANT_HEADER.encode():
                # Namespaced by the door's own principal: a door can name its callers, never
                # a caller with a key of its own on this node.
                tenant = value.decode("latin-1").strip()[:128]
                return _digest(f"{found[0]}/{tenant}"), found[1]
        return found

    def _key_principal(self, scope: Scope) -> tuple[str, bool] | None:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return None
                found = None
                # Every key compared as bytes in constant time, so the answer time leaks
                # nothing of the keys nor of which one (inference or admin) matched.
                for key, principal, admin in self._keys:
                    if hmac.compare_digest(token.strip(), key):
                        found = (principal, admin)
                return found
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._keys or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        found = self._principal(scope)
        if found is not None or self._open or scope["path"] in self._open_paths:
            if found is not None:
                state = scope.setdefault("state", {})
                state[_PRINCIPAL], state[_ADMIN] = found
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


class ControlAccess:
    """Who may call the routes that change engine state (pause, abort, weight updates...).

    With admin keys: their holders only (``--enable-control-routes`` changes nothing). Without:
    every caller the API-key check let in when ``enabled``; else nobody (an inference key's
    holder is told an admin key is needed, a server with no key at all that the routes are
    off)."""

    def __init__(
        self,
        api_key: str | Sequence[str] | None,
        admin_key: str | Sequence[str] | None,
        enabled: bool,
    ) -> None:
        self._keyed = bool(api_keys(api_key))
        self._admin_keyed = bool(api_keys(admin_key))
        self._enabled = enabled

    def check(self, scope_or_request: Any, what: str) -> None:
        """Raise ``AdminRequired`` or ``ControlRoutesDisabled`` unless this caller may run
        ``what`` (a route path, named in the message)."""
        if is_admin(scope_or_request) or (self._enabled and not self._admin_keyed):
            return
        if self._admin_keyed or self._keyed:
            raise AdminRequired(f"{what} changes engine state: it needs an admin API key")
        raise ControlRoutesDisabled(
            f"{what} changes engine state: start the server with --admin-api-key (or "
            "--enable-control-routes on a trusted network) to serve it"
        )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
