"""Request bodies with a size cap (decoded from their content coding), content negotiation, and
wire-encoded responses."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem_wire import (
    IDENTITY,
    ZSTD,
    PayloadTooLarge,
    WireFormat,
    body_coding,
    decode_body,
    encode_document,
    format_for_accept,
    format_of_content_type,
)
from tandem_wire.content_coding import declared_decoded_size

from .admission import Slot, slot_of
from .errors import BodyTimeout

__all__ = [
    "AcceptEncodingMiddleware",
    "CONTROL_BODY_BYTES",
    "BodyDeadline",
    "BodyDeadlineMiddleware",
    "BodyTooLarge",
    "MAX_BODY_HEADER",
    "add_body_deadline_flags",
    "PartsResponse",
    "body_chunks",
    "decoded",
    "negotiate",
    "read_body",
    "read_raw_body",
    "wire_response",
]

REQUEST_CODINGS = ZSTD
"""The request content codings every Tandem service decodes, as its answers advertise them in
``Accept-Encoding`` (RFC 7694): senders compress only toward a node that says this."""


MAX_BODY_HEADER = "x-tandem-max-body-bytes"
"""Set by a node on its ``/health`` answer: the largest request body it takes (a front door
learns its generate nodes' cap from it)."""


CONTROL_BODY_BYTES = 16 * 1024 * 1024
"""Largest control-route body (a weight update names its tensors, not their bytes), on a
generate node and on the front door that fans the route out to it."""


class BodyTooLarge(PayloadTooLarge):
    """The request body exceeds the route's byte limit (413 ``payload_too_large``).

    A WireError, so the handler every service installs for WireError renders it.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"request body exceeds {max_bytes} bytes")
        self.max_bytes = max_bytes


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body decoded from its ``Content-Encoding``, at most ``max_bytes`` both as sent
    and decoded (413 ``payload_too_large``; a zstd bomb is refused before it is inflated). An
    unknown coding is 415 ``unsupported_content_encoding`` before the body is read. Under
    ``admitted``, the decoded copy is charged to the request's slot before it is allocated
    (see ``decoded``)."""
    coding = body_coding(request.headers.get("content-encoding"))
    raw = await read_raw_body(request, max_bytes)
    return await decoded(slot_of(request), raw, coding, max_bytes)


async def decoded(slot: Slot | None, raw: bytes, coding: str, max_bytes: int) -> bytes:
    """``raw`` decoded from ``coding`` (``raw`` itself for ``identity``) in a worker thread
    (zstd releases the GIL: the event loop keeps serving), at most ``max_bytes``, and held
    against ``slot``'s budget before anything is allocated: the size the frame declares is
    charged first (429 when it does not fit now, 413 when it would not fit the whole budget),
    and a frame that does not declare it is decoded into no more than the room left (past it,
    429). The charge stays with the slot until it is released; ``slot.give_back`` returns it
    sooner for a copy dropped early."""
    if coding == IDENTITY:
        return raw
    if slot is None or slot.room() is None:
        plain = await asyncio.to_thread(decode_body, raw, coding, max_bytes)
        if slot is not None:
            slot.charge(len(plain))
        return plain
    size = declared_decoded_size(raw, coding)
    if size is not None and size <= max_bytes:
        slot.take(size)  # refused here when it does not fit, before any allocation
        try:
            plain = await asyncio.to_thread(decode_body, raw, coding, size)
        except PayloadTooLarge:
            slot.give_back(size)  # more frames than the first: decoded below, into the room
        except BaseException:
            slot.give_back(size)
            raise
        else:
            return plain
    room = min(max_bytes, slot.room() or 0)
    slot.take(room)
    try:
        plain = await asyncio.to_thread(decode_body, raw, coding, room)
    except PayloadTooLarge:
        slot.give_back(room)
        if room < max_bytes:
            # Larger than the room left, not than the route's cap: 429, or 413 when even an
            # empty process could not hold it beside this request's body.
            raise slot.refusal(room + 1) from None
        raise
    except BaseException:
        slot.give_back(room)
        raise
    slot.give_back(room - len(plain))
    return plain


async def read_raw_body(request: Request, max_bytes: int) -> bytes:
    """The whole body as sent (still encoded), refusing more than ``max_bytes`` without
    buffering the excess (see ``body_chunks``)."""
    return b"".join([chunk async for chunk in body_chunks(request, max_bytes)])


def body_chunks(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The body as it arrives, at most ``max_bytes`` (413 ``payload_too_large``).

    Content-Length is checked now, before anything is read; chunked or lying bodies are cut
    off as soon as the running total passes the limit. Under ``admitted``, each chunk is
    charged to the request's slot, which refuses it (429) once the process's byte budget is
    spent.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    return _chunks(request, max_bytes)


async def _chunks(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    slot = slot_of(request)
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise BodyTooLarge(max_bytes)
        if slot is not None:
            slot.read(len(chunk))
        yield chunk


@dataclass(frozen=True)
class BodyDeadline:
    """How long a request body may take to arrive: Apache's ``RequestReadTimeout
    body=timeout_s,MinRate=min_rate`` with nginx's ``client_body_timeout`` beside it.

    A body gets ``timeout_s`` seconds, plus one more second for every ``min_rate`` bytes that
    arrived, from the moment its request reached the app; and never more than ``timeout_s``
    between two pieces of it. Past either, it is refused with 408 ``body_timeout`` and the
    request (its admission slot with it) is let go. Without it, a client that declares a body
    and sends a byte every few seconds holds its slot for as long as it likes, and
    ``max_pending`` such clients shut a process to everyone else.
    """

    timeout_s: float = 30.0
    """The grace every body gets, and the longest pause between two of its pieces, in seconds."""

    min_rate: int = 64 * 1024
    """Bytes per second a body must keep on average past the grace."""

    @classmethod
    def of(cls, timeout_s: float, min_rate: int) -> BodyDeadline | None:
        """The deadline a service's ``--body-timeout-s`` and ``--body-min-rate`` set (None
        for a timeout of 0: no deadline)."""
        return cls(timeout_s, max(1, min_rate)) if timeout_s > 0 else None


def add_body_deadline_flags(parser: argparse.ArgumentParser) -> None:
    """A service's ``--body-timeout-s`` and ``--body-min-rate`` (its settings'
    ``body_timeout_s`` and ``body_min_rate``), with ``BodyDeadline``'s defaults."""
    d = BodyDeadline()
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=d.timeout_s,
        help="seconds a request body gets, and the longest pause within it, before 408 "
        "body_timeout frees its slot (0: no deadline; default: %(default)s)",
    )
    parser.add_argument(
        "--body-min-rate",
        type=int,
        default=d.min_rate,
        help="bytes per second a request body must keep on average once --body-timeout-s is "
        "spent (default: %(default)s)",
    )


class BodyDeadlineMiddleware:
    """Puts every request body on its ``BodyDeadline``: the app's ``receive`` raises
    ``BodyTimeout`` (408, rendered by the error handlers) once the body is late, whoever reads
    it (``body_chunks``, a stream forwarded upstream). Once the body has arrived whole,
    ``receive`` is left alone (it then waits for the client to leave, for as long as it likes).
    ``deadline=None``: no deadline."""

    def __init__(self, app: ASGIApp, deadline: BodyDeadline | None) -> None:
        self.app = app
        self.deadline = deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.deadline is None:
            await self.app(scope, receive, send)
            return
        await self.app(scope, _TimedBody(receive, self.deadline), send)


class _TimedBody:
    """One request's ``receive`` under its body deadline."""

    def __init__(self, receive: Receive, deadline: BodyDeadline) -> None:
        self._receive = receive
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._start = self._last = self._loop.time()
        self._arrived = 0
        self._whole = False

    def _due(self) -> float:
        d = self._deadline
        by_rate = self._start + d.timeout_s + self._arrived / d.min_rate
        return min(by_rate, self._last + d.timeout_s)

    async def __call__(self) -> Message:
        if self._whole:
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._due()):
                message = await self._receive()
        except TimeoutError:
            self._whole = True  # what follows is the client leaving, untimed
            d = self._deadline
            raise BodyTimeout(
                f"the request body was too slow: {self._arrived} bytes in "
                f"{self._loop.time() - self._start:.0f} s (each piece within {d.timeout_s:g} s, "
                f"{d.min_rate} bytes/s on average past that)"
            ) from None
        self._last = self._loop.time()
        self._arrived += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._whole = True
        return message


def negotiate(request: Request) -> tuple[WireFormat, WireFormat]:
    """(request body format from Content-Type, response format from Accept).

    Raises tandem_wire.InvalidDocument (400 ``invalid_request``) for an unknown Content-Type.
    """
    headers = request.headers
    return format_of_content_type(headers.get("content-type")), format_for_accept(
        headers.get("accept")
    )


def wire_response(
    obj: Any,
    fmt: WireFormat,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A Response holding ``obj`` (a msgspec Struct, list or dict) encoded in ``fmt``."""
    return Response(encode_document(obj, fmt), status_code, headers, media_type=fmt.content_type)


class PartsResponse(Response):
    """A response whose body is a list of byte pieces, sent one after the other.

    For answers holding megabytes of base64 (``encode_generate_request_parts``): joining the
    pieces first would copy all of them once more for nothing.
    """

    def __init__(
        self,
        parts: Sequence[bytes],
        status_code: int = 200,
        media_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.parts = [p for p in parts if p] or [b""]
        self.length = sum(map(len, self.parts))
        all_headers = {**(headers or {}), "content-length": str(self.length)}
        super().__init__(None, status_code, all_headers, media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        last = len(self.parts) - 1
        for i, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})


class AcceptEncodingMiddleware:
    """Adds ``Accept-Encoding: zstd`` to every answer (RFC 7694): the request codings this
    service decodes, so a client learns it may compress toward it (from any answer, a probe of
    ``/health`` included) and an older node, which never says it, never gets a compressed body.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def advertise(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"accept-encoding" for k, _ in headers):
                    headers.append((b"accept-encoding", REQUEST_CODINGS.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, advertise)
