"""Admission: a process holds at most N requests and B bytes of their bodies (and of what it
decoded from them); the next request is refused before its body is read."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tandem_wire import PayloadTooLarge

from .errors import Overloaded

__all__ = ["AdmissionGate", "Slot", "admitted", "slot_of"]

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

    def take(self, nbytes: int) -> None:
        """The service is about to hold ``nbytes`` more for this request (a decoded copy):
        charged before it is allocated, and refused as a body read past its declaration is
        (429, or 413 when this request alone would pass the whole budget)."""
        if self._gate is not None and nbytes > 0:
            self._gate._take(self, nbytes, refuse=True)

    def give_back(self, nbytes: int) -> None:
        """``nbytes`` taken ahead (``take``) turned out not to be needed."""
        if self._gate is not None and nbytes > 0:
            nbytes = min(nbytes, self.held)
            self._gate._take(self, -nbytes, refuse=False)

    def refusal(self, nbytes: int) -> Exception:
        """The error for a request that needs at least ``nbytes`` more than it holds, where
        they do not fit (see ``take``); for a decoded copy found larger than the room left."""
        gate = self._gate
        if gate is None or gate.max_bytes is None:
            return PayloadTooLarge(f"{nbytes} more bytes do not fit")
        return gate._refusal(self, nbytes)

    def room(self) -> int | None:
        """Bytes the gate's budget has left for anyone now (None: no byte budget)."""
        gate = self._gate
        if gate is None or gate.max_bytes is None:
            return None
        return max(0, gate.max_bytes - gate.held)

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
            raise Overloaded(
                f"{self._current} requests pending, the most this server holds; retry",
                retry_after=1,
                details=self._counts(),
            )
        if budget is not None and self._held + declared > budget:
            self.rejected.inc()
            raise self._bytes_spent(declared)
        self._current += 1
        self.pending.inc()
        self._held += declared
        self.held_bytes.inc(declared)
        return Slot(self, declared)

    def _take(self, slot: Slot, nbytes: int, *, refuse: bool) -> None:
        budget = self.max_bytes
        if refuse and budget is not None and self._held + nbytes > budget:
            raise self._refusal(slot, nbytes)
        self._held += nbytes
        slot.held += nbytes
        self.held_bytes.inc(nbytes)

    def _refusal(self, slot: Slot, nbytes: int) -> Overloaded | PayloadTooLarge:
        """Why ``slot`` cannot hold ``nbytes`` more: 413 when that passes the whole budget on
        its own, else 429 (counted)."""
        budget = self.max_bytes or 0
        if slot.held + nbytes > budget:
            return _over_budget(slot.held + nbytes, budget)
        self.rejected.inc()
        return self._bytes_spent(nbytes)

    def _counts(self) -> dict[str, int | None]:
        """What a 429 is judged on, as the process counts it when it refuses."""
        return {
            "pending": self._current,
            "max_pending": self.limit,
            "held_bytes": self._held,
            "max_held_bytes": self.max_bytes,
        }

    def _bytes_spent(self, wanted: int) -> Overloaded:
        return Overloaded(
            f"the requests pending here hold {self._held} of {self.max_bytes} bytes, "
            f"{wanted} more do not fit; retry",
            retry_after=1,
            details={**self._counts(), "wanted_bytes": wanted},
        )

    def _release(self, nbytes: int) -> None:
        self._current -= 1
        self._held -= nbytes
        self.pending.dec()
        self.held_bytes.dec(nbytes)


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
