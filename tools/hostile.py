"""Hostile clients against running services, for the budget tests and their measurements:
bodies that trickle, bodies that inflate, media that decode large, callers that never read
their answers, and how long a normal request waits beside them.

``python -m tools.hostile slow URL PATH``, ``python -m tools.hostile unread URL PATH`` and
``python -m tools.hostile zstd URL PATH PID`` print what one attack does to a running server
(the before/after figures on ``docs/hostile-and-soak.md`` come from these).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

__all__ = [
    "MediaServer",
    "NonReaders",
    "PeakRss",
    "SlowBodies",
    "inflating_body",
    "serve_time",
]


@dataclass
class SlowBodies:
    """``count`` connections that each declare a ``declared``-byte JSON body and send one byte
    of it every ``every_s`` seconds, until the server answers (its status is kept) or they are
    stopped. Open with ``with``; ``holding`` says how many have no answer yet."""

    url: str
    path: str
    count: int
    declared: int = 4096
    every_s: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)
    statuses: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._socks: list[socket.socket | None] = []
        self._thread = threading.Thread(target=self._trickle, daemon=True)

    def __enter__(self) -> SlowBodies:
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        head = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Content-Type: application/json",
            f"Content-Length: {self.declared}",
            *(f"{k}: {v}" for k, v in self.headers.items()),
        ]
        for _ in range(self.count):
            sock = socket.create_connection((host, port), timeout=30)
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b"{")
            sock.setblocking(False)
            self._socks.append(sock)
            self.statuses.append(None)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self._socks:
            if sock is not None:
                sock.close()

    @property
    def holding(self) -> int:
        return sum(s is None for s in self.statuses)

    def _trickle(self) -> None:
        while not self._stop.wait(self.every_s):
            for i, sock in enumerate(self._socks):
                if sock is None:
                    continue
                answer = b""
                try:
                    answer = sock.recv(65536)
                except BlockingIOError:
                    try:
                        sock.send(b" ")
                        continue
                    except OSError:
                        pass
                except OSError:
                    pass
                line = answer.split(b"\r\n", 1)[0].split()
                self.statuses[i] = int(line[1]) if len(line) > 1 and line[1].isdigit() else 0
                sock.close()
                self._socks[i] = None


class NonReaders:
    """``count`` connections that each send a whole request (``body``, JSON unless
    ``headers`` say otherwise) and never read its answer, their receive buffers shrunk to
    ``rcvbuf`` bytes, so that the server's writes soon wait on them. Open with ``with``;
    ``statuses()`` peeks at each answer's status line without reading it (None: nothing came
    yet), ``cut()`` counts the connections the server has closed or reset."""

    def __init__(
        self,
        url: str,
        path: str,
        count: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        rcvbuf: int = 4096,
    ) -> None:
        self.url, self.path, self.count, self.body = url, path, count, body
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.rcvbuf = rcvbuf
        self.socks: list[socket.socket] = []

    def __enter__(self) -> NonReaders:
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        head = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {host}:{port}",
            f"Content-Length: {len(self.body)}",
            *(f"{k}: {v}" for k, v in self.headers.items()),
        ]
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + self.body
        for _ in range(self.count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # Before connecting: the window the server sees stays this small.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.settimeout(30)
            sock.connect((host, port))
            sock.sendall(request)
            sock.setblocking(False)
            self.socks.append(sock)
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in self.socks:
            sock.close()

    def _peek(self, sock: socket.socket) -> bytes | None:
        """The answer's first bytes, left unread; None when none came (or none can)."""
        try:
            return sock.recv(64, socket.MSG_PEEK)
        except OSError:
            return None

    def statuses(self) -> list[int | None]:
        out: list[int | None] = []
        for sock in self.socks:
            head = self._peek(sock)
            line = (head or b"").split(b"\r\n", 1)[0].split()
            out.append(int(line[1]) if len(line) > 1 and line[1].isdigit() else None)
        return out

    def cut(self) -> int:
        """Connections the server closed or reset (their unread bytes may still be queued
        here, so reading would not tell: the kernel's TCP state does)."""
        return sum(_tcp_state(sock) != _TCP_ESTABLISHED for sock in self.socks)


_TCP_ESTABLISHED = 1
"""``tcpi_state`` of an open connection (Linux ``TCP_INFO``; its first byte)."""


def _tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


class MediaServer:
    """Serves ``files`` (path -> bytes, Content-Length declared) on 127.0.0.1 from a thread,
    as a media host a render worker fetches from (allow it with ``--allowed-private-hosts
    127.0.0.1``). Open with ``with``; ``url(path)`` names a file."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                data = owner.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:  # the worker refused it and hung up
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}{path}"

    def __enter__(self) -> MediaServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def serve_time(
    post: Callable[[], httpx.Response], limit_s: float, *, retry_s: float = 0.5
) -> tuple[float | None, list[int]]:
    """Seconds until ``post`` is answered 2xx, asking again every ``retry_s`` while it is
    refused (429, 503) or fails to connect; None if not within ``limit_s``. Also every status
    seen."""
    start = time.monotonic()
    seen: list[int] = []
    while time.monotonic() - start < limit_s:
        try:
            status = post().status_code
        except httpx.TransportError:
            status = 0
        seen.append(status)
        if 200 <= status < 300:
            return time.monotonic() - start, seen
        time.sleep(retry_s)
    return None, seen


def inflating_body(document: dict[str, Any], pad_bytes: int) -> tuple[bytes, int]:
    """A zstd frame (its size declared) of ``document`` as JSON with a string of
    ``pad_bytes`` spaces added under ``"pad"``: a few KB on the wire, ``pad_bytes`` decoded.
    Returns (frame, decoded size)."""
    from tandem_wire import compress_zstd

    text = json.dumps(document).encode()
    plain = text[:-1] + b', "pad": "' + b" " * pad_bytes + b'"}'
    return compress_zstd(plain), len(plain)


class PeakRss:
    """The highest resident size of some processes (summed) while the block runs, sampled
    every 5 ms; ``growth`` is the peak over the size at the start."""

    def __init__(self, *pids: int) -> None:
        self.processes = [psutil.Process(p) for p in pids]
        self.baseline = self.peak = self._rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _rss(self) -> int:
        return sum(p.memory_info().rss for p in self.processes)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


@contextmanager
def concurrently(calls: list[Callable[[], Any]]) -> Iterator[list[Any]]:
    """Runs every call in its own thread; the results (or exceptions) once the block ends."""
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:  # reported, not raised: the caller judges
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    try:
        yield results
    finally:
        for t in threads:
            t.join()


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="attack", required=True)
    slow = sub.add_parser("slow", help="slow bodies beside a normal request")
    slow.add_argument("url")
    slow.add_argument("path")
    slow.add_argument("--count", type=int, default=8)
    slow.add_argument("--every-s", type=float, default=5.0)
    slow.add_argument("--limit-s", type=float, default=120.0)
    slow.add_argument("--normal", required=True, help="the normal request's JSON body")
    unread = sub.add_parser("unread", help="callers that never read, beside a normal request")
    unread.add_argument("url")
    unread.add_argument("path")
    unread.add_argument("--count", type=int, default=64)
    unread.add_argument("--body", required=True, help="the unread requests' JSON body")
    unread.add_argument("--normal", required=True, help="the normal request's JSON body")
    unread.add_argument("--limit-s", type=float, default=120.0)
    z = sub.add_parser("zstd", help="bodies that inflate, and the server's RSS")
    z.add_argument("url")
    z.add_argument("path")
    z.add_argument("pids", type=int, nargs="+")
    z.add_argument("--count", type=int, default=8)
    z.add_argument("--inflate-mib", type=int, default=64)
    z.add_argument("--document", default="{}")
    args = p.parse_args()
    if args.attack == "unread":
        normal = json.loads(args.normal)
        body = json.dumps(json.loads(args.body)).encode()
        with NonReaders(args.url, args.path, args.count, body) as readers:
            time.sleep(1.0)
            seconds, seen = serve_time(
                lambda: httpx.post(f"{args.url}{args.path}", json=normal, timeout=60),
                args.limit_s,
            )
            report = {
                "served_after_s": seconds,
                "refused": sum(s == 429 for s in seen),
                "unread_statuses": readers.statuses(),
                "cut": readers.cut(),
            }
        print(json.dumps(report))
    elif args.attack == "slow":
        normal = json.loads(args.normal)
        with SlowBodies(args.url, args.path, args.count, every_s=args.every_s) as slow_bodies:
            time.sleep(1.0)
            seconds, seen = serve_time(
                lambda: httpx.post(f"{args.url}{args.path}", json=normal, timeout=60),
                args.limit_s,
            )
            print(
                json.dumps(
                    {
                        "served_after_s": seconds,
                        "refused": sum(s == 429 for s in seen),
                        "slow_statuses": slow_bodies.statuses,
                    }
                )
            )
    else:
        frame, size = inflating_body(json.loads(args.document), args.inflate_mib << 20)
        headers = {"content-type": "application/json", "content-encoding": "zstd"}

        def post() -> int:
            url = f"{args.url}{args.path}"
            return httpx.post(url, content=frame, headers=headers, timeout=120).status_code

        with PeakRss(*args.pids) as rss, concurrently([post] * args.count) as statuses:
            pass
        print(
            json.dumps(
                {
                    "wire_bytes": len(frame),
                    "decoded_bytes": size,
                    "statuses": statuses,
                    "rss_growth_mib": rss.growth >> 20,
                },
                default=str,
            )
        )


if __name__ == "__main__":
    _main()
