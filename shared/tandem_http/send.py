"""Answers with a send deadline: the twin of ``BodyDeadline`` for the bytes a service writes
back. A caller that stops reading its answer leaves the service's writes blocked on TCP flow
control (uvicorn's ``send`` waits in ``drain`` while the transport's buffer is over its high-water
mark); without a deadline it holds its admission slot, and the answer's bytes, for as long as it
keeps the connection open."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "SendDeadline",
    "SendDeadlineMiddleware",
    "SendTimeout",
    "TRANSPORT_KEY",
    "TransportInScope",
    "add_send_deadline_flags",
]

log = logging.getLogger("tandem")

TRANSPORT_KEY = "tandem.transport"
"""Where ``TransportInScope`` leaves the connection's transport in a request's ASGI scope: the
send deadline reads how much of the answer is still buffered from it, and aborts it."""

_FLUSH_POLL_S = (0.01, 0.5)
"""How often a finished answer's buffer is looked at until it has been written out: first, and
at most (the interval doubles in between)."""


_RESET = struct.pack("ii", 1, 0)
"""``SO_LINGER`` on, for 0 s: closing the socket resets the connection."""


class _Transport(Protocol):
    def get_write_buffer_size(self) -> int: ...

    def get_extra_info(self, name: str) -> Any: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class SendDeadline:
    """How long an answer may take to be read: nginx's ``send_timeout`` with a minimum rate
    beside it, as ``BodyDeadline`` has for request bodies.

    Only the time the service waits on the caller counts (a write blocked because the caller
    does not read, or a finished answer still buffered): a stream that waits for its engine is
    never cut. No wait may last ``timeout_s``, and all of them together may last ``timeout_s``
    plus one second for every ``min_rate`` bytes written. Past either the connection is
    aborted (its buffered bytes dropped), and the request sees its caller gone, as when it
    hangs up: a stream stops and its engine request is aborted, and its admission slot is
    given back. A finished answer keeps its slot until its bytes have been written out.
    """

    timeout_s: float = 30.0
    """The grace every answer gets, and the longest a write may wait on the caller, in seconds."""

    min_rate: int = 64 * 1024
    """Bytes per second the caller must read on average, in the time it keeps writes waiting,
    past the grace."""

    @classmethod
    def of(cls, timeout_s: float, min_rate: int) -> SendDeadline | None:
        """The deadline a service's ``--send-timeout-s`` and ``--send-min-rate`` set (None for
        a timeout of 0: no deadline)."""
        return cls(timeout_s, max(1, min_rate)) if timeout_s > 0 else None


def add_send_deadline_flags(parser: argparse.ArgumentParser) -> None:
    """A service's ``--send-timeout-s`` and ``--send-min-rate`` (its settings'
    ``send_timeout_s`` and ``send_min_rate``), with ``SendDeadline``'s defaults."""
    d = SendDeadline()
    parser.add_argument(
        "--send-timeout-s",
        type=float,
        default=d.timeout_s,
        help="seconds an answer may wait on a caller that does not read it before the "
        "connection is cut and its slot freed (0: no deadline; default: %(default)s)",
    )
    parser.add_argument(
        "--send-min-rate",
        type=int,
        default=d.min_rate,
        help="bytes per second a caller must read its answer at on average, in the time it "
        "keeps writes waiting, once --send-timeout-s is spent (default: %(default)s)",
    )


class TransportInScope:
    """Server-side ASGI wrapper: puts the connection's transport in each HTTP request's scope
    (``TRANSPORT_KEY``), for ``SendDeadlineMiddleware``. ASGI has no way to abort a connection
    or see its buffer; uvicorn's ``send`` is a method of its request cycle, which holds the
    transport."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if scope["type"] == "http" and transport is not None:
            scope[TRANSPORT_KEY] = transport
        await self.app(scope, receive, send)


class SendTimeout(Exception):
    """An answer's send passed its deadline where no transport could be aborted: unwinds the
    app (caught by ``SendDeadlineMiddleware``; the server closes the connection)."""


class SendDeadlineMiddleware:
    """Puts every answer on its ``SendDeadline`` (``deadline=None``: none). Where the server put
    the transport in the scope (``TransportInScope``), a late answer's connection is aborted and
    the app sees its caller gone; elsewhere ``SendTimeout`` unwinds it."""

    def __init__(self, app: ASGIApp, deadline: SendDeadline | None) -> None:
        self.app = app
        self.deadline = deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.deadline is None:
            await self.app(scope, receive, send)
            return
        timed = _TimedSend(send, self.deadline, scope.get(TRANSPORT_KEY))
        try:
            await self.app(scope, receive, timed)
        except SendTimeout:
            pass  # already logged; the server closes what the app left unfinished
        if timed.cut:
            # The server learns of the abort on the loop's next turn: returned before it, the
            # answer would look abandoned by the app rather than by its caller.
            await asyncio.sleep(0)


class _TimedSend:
    """One request's ``send`` under its send deadline."""

    def __init__(self, send: Send, deadline: SendDeadline, transport: _Transport | None) -> None:
        self._send = send
        self._deadline = deadline
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._sent = 0
        """Bytes handed to the server so far."""
        self._waited = 0.0
        """Seconds the answer's writes have waited on the caller so far."""
        self.cut = False

    def _room(self, read: int) -> float:
        """Seconds the next wait may last, ``read`` bytes having been taken by the caller."""
        d = self._deadline
        return min(d.timeout_s, d.timeout_s + read / d.min_rate - self._waited)

    async def __call__(self, message: Message) -> None:
        if self.cut:
            return  # as a server's send for a caller that left
        start = self._loop.time()
        try:
            async with asyncio.timeout(max(0.0, self._room(self._sent))):
                await self._send(message)
        except TimeoutError:
            self._late()
            return
        finally:
            self._waited += self._loop.time() - start
        self._sent += len(message.get("body", b""))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await self._flushed()

    async def _flushed(self) -> None:
        """Returns once the answer's last bytes left the process (the server's ``send``
        returns as soon as they are buffered): until then the request holds its slot."""
        transport = self._transport
        if transport is None:
            return
        poll = _FLUSH_POLL_S[0]
        left = transport.get_write_buffer_size()
        idle_since = self._loop.time()
        while left > 0:
            await asyncio.sleep(poll)
            self._waited += poll
            now_left = transport.get_write_buffer_size()
            now = self._loop.time()
            if now_left < left:
                idle_since = now
            left = now_left
            stalled = now - idle_since >= self._deadline.timeout_s
            if left > 0 and (stalled or self._room(self._sent - left) <= 0):
                self._late()
                return
            poll = min(poll * 2, _FLUSH_POLL_S[1])

    def _late(self) -> None:
        self.cut = True
        d = self._deadline
        log.info(
            "answer not read in time (%d bytes written, %.0f s waiting on the caller; each "
            "wait within %g s, %d bytes/s on average past that): connection cut",
            self._sent,
            self._waited,
            d.timeout_s,
            d.min_rate,
        )
        if self._transport is None:
            raise SendTimeout("the answer was not read in time")
        # Reset, its buffered bytes dropped, the kernel's too (a close would wait to write
        # them, for ever; nginx's reset_timedout_connection); the server then tells the app
        # its caller left.
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self._transport.abort()
