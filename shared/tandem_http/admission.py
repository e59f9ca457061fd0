"""Admission: a process holds at most N requests and B bytes of their bodies (and of what it
decoded from them); the next request is refused before its body is read."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem_wire import PayloadTooLarge

from .errors import Overloaded

__all__ = ["AdmissionGate", "HeldStreamingResponse", "Slot", "admitted", "slot_of"]

Handler = Callable[[Request], Awaitable[Response]]

_SLOT_KEY = "tandem.admission_slot"
"""Where ``admitted`` leaves a request's slot in its ASGI scope, for the body readers."""


class Slot:
    """One admitted request's place and the bytes it holds; released once, however often
    ``release`` is called. The body readers of ``tandem_http.body`` charge it as they read."""

    def __init__(self, gate: AdmissionGate, declared: int) -> None:
        self._gate: AdmissionGate | None = gate
        self._reserved = declared
        """Body bytes charged ahead, at admission (the request's Content-Length)."""
        self._read = 0
        self.held = declared
        """Bytes this request holds in the gate's account."""

    def read(self, nbytes: int) -> None:
        """``nbytes`` more of the body were read: those past what was reserved at admission
        (a chunked body, or one longer than it said) are charged now, and refused (429, or 413
        when this request alone passes the whole budget) if that passes the budget."""
        self._read += nbytes
        extra = self._read - self._reserved
        if extra > 0 and self._gate is not None:
            self._gate._take(self, extra, refuse=True)
            self._reserved = self._read

    def charge(self, nbytes: int) -> None:
        """The service holds ``nbytes`` more for this request (what it decoded from the body):
        counted until the slot is released, against the admission of later requests; never
        refused (the memory is already taken)."""
        if self._gate is not None and nbytes > 0:
            self._gate._take(self, nbytes, refuse=False)

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._release(self.held)


class AdmissionGate:
    """Bounds the requests one process holds (reading, queued, running, or streaming), and the
    bytes they hold (bodies read or being read, plus what the service decoded from them).

    Past ``limit`` requests, or when the bytes held plus a request's Content-Length would pass
    ``max_bytes``, ``admit`` raises ``Overloaded`` (429, retry after a second) at once: callers
    admit at the very start of a request, before its body is read or decoded, so a refusal is
    cheap and the process never queues without bound. A request declaring more than the whole
    ``max_bytes`` is 413: it could never be admitted. ``max_bytes=None``: no byte budget.
    Make one per process in the app factory.
    """

    def __init__(
        self,
        limit: int,
        metric_prefix: str,
        registry: CollectorRegistry | None = REGISTRY,
        max_bytes: int | None = None,
    ) -> None:
        self.limit = limit
        self.max_bytes = max_bytes or None
        self._current = 0
        self._held = 0
        # Summed over live worker processes: reads as the queue depth of the whole service.
        self.pending = Gauge(
            f"{metric_prefix}_pending",
            "Requests admitted and not yet answered",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.held_bytes = Gauge(
            f"{metric_prefix}_held_bytes",
            "Bytes of request bodies (and what was decoded from them) held by admitted requests",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.rejected = Counter(
            f"{metric_prefix}_rejected", "Requests refused with 429", registry=registry
        )

    @property
    def current(self) -> int:
        """Requests this process holds now."""
        return self._current

    @property
    def held(self) -> int:
        """Bytes the requests of this process hold now."""
        return self._held

    def admit(self, declared: int = 0) -> Slot:
        """A slot for a request whose body says it is ``declared`` bytes long (charged now)."""
        budget = self.max_bytes
        if budget is not None and declared > budget:
            raise _over_budget(declared, budget)
        if self._current >= self.limit:
            self.rejected.inc()
            raise Overloaded(f"more than {self.limit} requests pending; retry", retry_after=1)
        if budget is not None and self._held + declared > budget:
            self.rejected.inc()
            raise _bytes_spent(budget)
        self._current += 1
        self.pending.inc()
        self._held += declared
        self.held_bytes.inc(declared)
        return Slot(self, declared)

    def _take(self, slot: Slot, nbytes: int, *, refuse: bool) -> None:
        budget = self.max_bytes
        if refuse and budget is not None and self._held + nbytes > budget:
            if slot.held + nbytes > budget:
                raise _over_budget(slot.held + nbytes, budget)
            self.rejected.inc()
            raise _bytes_spent(budget)
        self._held += nbytes
        slot.held += nbytes
        self.held_bytes.inc(nbytes)

    def _release(self, nbytes: int) -> None:
        self._current -= 1
        self._held -= nbytes
        self.pending.dec()
        self.held_bytes.dec(nbytes)


def _bytes_spent(budget: int) -> Overloaded:
    return Overloaded(
        f"the requests pending here hold their share of {budget} bytes; retry", retry_after=1
    )


def _over_budget(size: int, budget: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"a request of {size} bytes is more than this server holds for all its requests "
        f"({budget} bytes)"
    )


def slot_of(conn: HTTPConnection) -> Slot | None:
    """The admission slot ``admitted`` gave this request (None on a route without a gate)."""
    slot = conn.scope.get(_SLOT_KEY)
    return slot if isinstance(slot, Slot) else None


def declared_length(conn: HTTPConnection) -> int:
    """The body size a request declares (Content-Length); 0 when it declares none."""
    value = conn.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else 0


class HeldStreamingResponse(StreamingResponse):
    """A streaming answer that keeps its request's admission slot until it has been sent,
    failed, or its client left (whether or not its body was ever iterated). Routes under
    ``admitted`` hold their slot this long whatever they answer; this class keeps a slot
    handed to it by hand."""

    slot: Slot | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()


class _Held(Response):
    """A route's answer, sent as it is; its slot is released once it has been sent, failed,
    or its client left."""

    def __init__(self, inner: Response, slot: Slot) -> None:
        # Not Response.__init__: nothing is rendered here, the inner answer sends itself.
        self.inner = inner
        self.slot = slot
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background = inner.background

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
            if self.background is not None and self.background is not self.inner.background:
                await self.background()  # what FastAPI attached to this wrapper
        finally:
            self.slot.release()


def admitted(gate: AdmissionGate) -> Callable[[Handler], Handler]:
    """Route decorator: admit before the handler runs (by count and by the declared body
    size, before any of the body is read); the body readers of ``tandem_http.body`` charge
    the slot as they read; released when the answer has been sent (streams included), or
    failed, or its client left."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: Request, *args: Any, **kwargs: Any) -> Response:
            slot = gate.admit(declared_length(request))
            request.scope[_SLOT_KEY] = slot
            try:
                response = await handler(request, *args, **kwargs)
            except BaseException:
                slot.release()
                raise
            return _Held(response, slot)

        return run

    return decorate
