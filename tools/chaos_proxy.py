"""A TCP proxy in front of one node that a fault test can break (``tools.chaos``'s nemesis).

Bytes pass through unchanged until told otherwise:

- ``black_hole()``: nothing passes either way (connections are still accepted, as a host behind
  a partition still completes handshakes in the kernel); ``heal()`` lets the held bytes through
  late, or with ``drop=True`` resets every connection that was held (the bytes are lost);
- ``delay(seconds)``: every read is held that long before it is passed on;
- ``cut_next(path, ...)``: the next request to each path is cut mid-body (its head and half of
  the body bytes at hand pass, then both sides are reset): the node never runs it, the caller
  sees the connection drop without an answer;
- the node's port refusing connections (killed, restarting) closes the proxy's own listener
  until the node accepts again, so a caller sees a refused connection as it would without the
  proxy (and moves the request to another node), not an answer cut short.

Every request id matching ``MARKER`` in the bytes toward the node is recorded with the time
it passed (``seen``), so a test knows which node each request reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

__all__ = ["MARKER", "FaultProxy"]

MARKER = re.compile(rb"chq\d{7}")
"""The request ids the proxy records (``tools.chaos`` names its requests so)."""
_TAIL = 96
"""Bytes of the previous read kept, so that a marker or request line split across reads is
still found."""
_READ = 65536
_PENDING_S = 0.05
"""How long a connection whose node side closed stays open to the caller: the loop reads what
the caller had sent meanwhile (recorded) before the reset."""


@dataclass
class _Conn:
    sides: list[asyncio.StreamWriter] = field(default_factory=list)
    held: bool = False
    """It was open while the proxy black-holed traffic."""
    dead: bool = False


class FaultProxy:
    """Listens on 127.0.0.1 (a free port, kept across listener restarts) and forwards to
    ``upstream_port`` on 127.0.0.1."""

    def __init__(self, name: str, upstream_port: int) -> None:
        self.name = name
        self.upstream_port = upstream_port
        self.port = 0
        self.seen: list[tuple[float, str]] = []
        """(monotonic time, request id) of each request id that passed toward the node."""
        self.cuts: list[tuple[float, str]] = []
        """(monotonic time, path) of each request cut."""
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._delay = 0.0
        self._cut: set[str] = set()
        self._open: dict[int, _Conn] = {}
        self._server: asyncio.Server | None = None
        self._probe: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        """Resets under way after a node's death (held here: the loop keeps only weak ones)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        await self._stop_listening()
        for conn in list(self._open.values()):
            _reset(conn)

    # -- what the nemesis does ------------------------------------------------------------

    def black_hole(self) -> None:
        self._flowing.clear()

    def heal(self, drop: bool = False) -> None:
        """Traffic flows again; ``drop``: the connections held meanwhile are reset first (what
        they carried is lost)."""
        if drop:
            for conn in list(self._open.values()):
                if conn.held:
                    _reset(conn)
        self._delay = 0.0
        self._flowing.set()

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def cut_next(self, *paths: str) -> None:
        self._cut.update(paths)

    def disarm(self) -> None:
        self._cut.clear()

    def node_down(self) -> None:
        """The node was killed: refuse connections now, until its port accepts again, and
        close the open ones as its kernel does."""
        if self._server is not None:
            # At once, not when the probe first runs: a connection accepted meanwhile would
            # be reset, where a dead node's port refuses it (and the caller tries another).
            self._server.close()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._until_node_accepts())
        # Now, not when the node's side of each closes: a big process's sockets close only
        # once its memory is released, and a caller reusing a kept-alive connection until then
        # loses its request where, without the proxy, it would have found the connection closed.
        for conn in list(self._open.values()):
            task = asyncio.ensure_future(self._node_side_closed(conn))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    # -- forwarding -----------------------------------------------------------------------

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _until_node_accepts(self) -> None:
        await self._stop_listening()
        while True:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            w.close()
            break
        while self._server is None:
            try:
                await self.start()
            except OSError:  # the port is briefly busy: try again
                await asyncio.sleep(0.2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn([writer])
        self._open[id(conn)] = conn
        try:
            held = await self._hold(reader, conn) if not self._flowing.is_set() else b""
            if conn.dead:
                return
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                # Accepted just before the node's death was known: what the caller sent was
                # sent to this node, and is lost with it.
                await self._record_first_read(reader)
                _reset(conn)
                self.node_down()
                return
            conn.sides.append(up_w)
            if held:
                up_w.write(held)
            await asyncio.gather(
                self._pump(reader, up_w, conn, toward_node=True),
                self._pump(up_r, writer, conn, toward_node=False),
            )
        finally:
            self._open.pop(id(conn), None)
            _reset(conn)

    async def _hold(self, reader: asyncio.StreamReader, conn: _Conn) -> bytes:
        """A connection made during a black hole: what the caller sends is read (and its
        request ids recorded: they were sent to this node) and held until the hole heals."""
        conn.held = True
        held = b""
        flowing = asyncio.ensure_future(self._flowing.wait())
        try:
            while not self._flowing.is_set() and not conn.dead:
                read = asyncio.ensure_future(reader.read(_READ))
                await asyncio.wait({read, flowing}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    break
                data = read.result()
                if not data:
                    _reset(conn)  # the caller gave up
                    break
                tail = held[-_TAIL:]
                self._record(tail + data, len(tail))
                held += data
        finally:
            flowing.cancel()
        return held

    async def _record_first_read(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(TimeoutError, OSError):
            self._record(await asyncio.wait_for(reader.read(_READ), 0.5), 0)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        conn: _Conn,
        toward_node: bool,
    ) -> None:
        tail = b""
        try:
            while not conn.dead:
                data = await src.read(_READ)
                if not data:
                    if not toward_node:
                        await self._node_side_closed(conn)
                    break
                if toward_node:  # recorded as read: it was sent to this node, held or not
                    scan = tail + data
                    self._record(scan, len(tail))
                    tail = scan[-_TAIL:]
                await self._pass(conn)
                if self._delay:
                    await asyncio.sleep(self._delay)
                if conn.dead:
                    break
                if toward_node:
                    cut = self._cut_at(scan, len(scan) - len(data))
                    if cut is not None:
                        dst.write(data[:cut])
                        with contextlib.suppress(OSError):
                            await dst.drain()
                        break  # both sides reset in ``finally``: no answer comes
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            _reset(conn)

    async def _node_side_closed(self, conn: _Conn) -> None:
        """The node closed its side (or died): what the caller sent before is read, and so
        recorded as sent to this node, before both sides are reset (without the beat the reset
        could drop those bytes unread, and the caller's failed request would count against a
        node that never saw it)."""
        await asyncio.sleep(_PENDING_S)
        _reset(conn)

    async def _pass(self, conn: _Conn) -> None:
        if not self._flowing.is_set():
            conn.held = True
            await self._flowing.wait()

    def _record(self, scan: bytes, old: int) -> None:
        now = time.monotonic()
        for m in MARKER.finditer(scan):
            if m.end() > old:  # not wholly in the previous read's tail (counted then)
                self.seen.append((now, m.group().decode()))

    def _cut_at(self, scan: bytes, old: int) -> int | None:
        """Where to cut this read (an index into its new bytes), if it carries an armed
        request line: after its head and half the body bytes at hand."""
        for path in list(self._cut):
            line = f" {path} HTTP/1.1\r\n".encode()
            at = scan.find(line)
            if at < 0 or at + len(line) <= old:
                continue
            self._cut.discard(path)
            self.cuts.append((time.monotonic(), path))
            head_end = scan.find(b"\r\n\r\n", at)
            if head_end < 0:
                return max(0, at + len(line) - old)
            body_start = head_end + 4
            return max(0, body_start + (len(scan) - body_start) // 2 - old)
        return None


def _reset(conn: _Conn) -> None:
    """Both sides closed at once with a reset (as a dead host's kernel answers)."""
    conn.dead = True
    for w in conn.sides:
        w.transport.abort()
