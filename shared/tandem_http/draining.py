"""Shutdown that drains: after SIGTERM a server answers new requests 503 until its in-flight
requests have finished (or a grace period ran out), then exits."""

from __future__ import annotations

import signal
import time
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tandem_wire import error_types

from .errors import send_error
from .send import TransportInScope

__all__ = ["DRAINING_HEADER", "Drain", "DrainGate", "DrainingConfig", "DrainingServer"]

DRAINING_HEADER = "x-tandem-draining"
"""Set on the 503 of a draining server: proxies may resend the request elsewhere unread."""

DRAIN_GRACE_S = 30.0
"""How long in-flight requests may run after SIGTERM before the server stops anyway."""
_CLOSE_GRACE_S = 5.0
"""uvicorn's own graceful-shutdown bound, after draining (only stragglers of an expired drain)."""
_OPEN_PATHS = frozenset({"/metrics"})
"""Still answered while draining: scrapers see the last figures of a stopping process."""


class Drain:
    """One process's shutdown state: when draining started, and how many requests it holds."""

    def __init__(self, grace_s: float = DRAIN_GRACE_S) -> None:
        self.grace_s = grace_s
        self.started_at: float | None = None
        self.in_flight = 0

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def start(self) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic()

    def finished(self) -> bool:
        """Draining, and nothing left to wait for (no request in flight, or out of time)."""
        if self.started_at is None:
            return False
        return self.in_flight == 0 or time.monotonic() - self.started_at >= self.grace_s


class DrainGate:
    """Pure ASGI wrapper around the whole app: counts HTTP requests in flight, and once the
    process drains answers every new one (``/health`` included, so balancers stop sending)
    with 503 ``shutting_down``, which callers may retry on another node: it was not run."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining and scope["path"] not in _OPEN_PATHS:
            await _refuse(scope, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


async def _refuse(scope: Scope, send: Send) -> None:
    await send_error(
        scope,
        send,
        status_code=503,
        type=error_types.SHUTTING_DOWN,
        message="this server is shutting down; send the request to another node",
        headers={"retry-after": "1", "connection": "close", DRAINING_HEADER: "1"},
    )


KEEP_ALIVE_S = 75
"""How long an idle client connection is kept open. Longer than clients keep theirs (httpx
and the OpenAI SDK: 5 s), so the client closes first: at uvicorn's 5 s both sides expired
together, and a request sent as the server closed failed with a reset (1 in 5410 in the soak)."""


class DrainingConfig(uvicorn.Config):
    """uvicorn's Config whose loaded app sits behind a DrainGate on ``drain``, each request's
    scope holding its connection's transport (``TransportInScope``, for the send deadline)."""

    def __init__(self, app: object, *, drain: Drain, **kwargs: object) -> None:
        kwargs.setdefault("timeout_graceful_shutdown", int(_CLOSE_GRACE_S))
        kwargs.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self.drain = drain

    def load(self) -> None:
        super().load()
        self.loaded_app = DrainGate(TransportInScope(self.loaded_app), self.drain)


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains on the first SIGTERM/SIGINT instead of closing its sockets
    at once; a further SIGINT (Ctrl-C twice) falls back to uvicorn's own exit."""

    def __init__(self, config: DrainingConfig) -> None:
        super().__init__(config)
        self.drain = config.drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.drain.draining and not self.should_exit:
            self.drain.start()
            return
        if sig == signal.SIGINT:
            super().handle_exit(sig, frame)
        # A repeated SIGTERM (the supervisor passing on what the process group already got)
        # must not cut the drain short.

    async def on_tick(self, counter: int) -> bool:
        if self.drain.finished():
            return True
        return await super().on_tick(counter)
