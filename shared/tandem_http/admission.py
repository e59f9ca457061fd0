"""Admission: at most N requests held by a process, the next refused before any work is done."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import Overloaded

__all__ = ["AdmissionGate", "HeldStreamingResponse", "Slot", "admitted"]

Handler = Callable[[Request], Awaitable[Response]]


class Slot:
    """One admitted request's place; released once, however often ``release`` is called."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate: AdmissionGate | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._release()


class AdmissionGate:
    """Bounds the requests one process holds (reading, queued, running, or streaming).

    Past ``limit``, ``admit`` raises ``Overloaded`` (429, retry after a second) at once: callers
    admit at the very start of a request, before its body is read or decoded, so a refusal is
    cheap and the process never queues without bound. Make one per process in the app factory.
    """

    def __init__(
        self, limit: int, metric_prefix: str, registry: CollectorRegistry | None = REGISTRY
    ) -> None:
        self.limit = limit
        self._current = 0
        # Summed over live worker processes: reads as the queue depth of the whole service.
        self.pending = Gauge(
            f"{metric_prefix}_pending",
            "Requests admitted and not yet answered",
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

    def admit(self) -> Slot:
        if self._current >= self.limit:
            self.rejected.inc()
            raise Overloaded(f"more than {self.limit} requests pending; retry", retry_after=1)
        self._current += 1
        self.pending.inc()
        return Slot(self)

    def _release(self) -> None:
        self._current -= 1
        self.pending.dec()


class HeldStreamingResponse(StreamingResponse):
    """A streaming answer that keeps its request's admission slot until it has been sent,
    failed, or its client left (whether or not its body was ever iterated)."""

    slot: Slot | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()


def admitted(gate: AdmissionGate) -> Callable[[Handler], Handler]:
    """Route decorator: admit before the handler runs; release when it returns, or when its
    ``HeldStreamingResponse`` is done."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: Request, *args: Any, **kwargs: Any) -> Response:
            slot = gate.admit()
            try:
                response = await handler(request, *args, **kwargs)
            except BaseException:
                slot.release()
                raise
            if isinstance(response, HeldStreamingResponse):
                response.slot = slot
            else:
                slot.release()
            return response

        return run

    return decorate
