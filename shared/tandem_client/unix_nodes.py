"""Nodes on a Unix-domain socket: ``unix:/run/tandem/generate.sock``, and the httpx client
that reaches them (``node_client``: the door's and tandem_client's).

A node started with ``--uds PATH`` listens on that socket instead of a TCP port, which spares
co-located tiers the loopback TCP stack (at concurrency 1, 55% of the front door's
GIL-holding samples were loopback sends). Its URL is ``unix:`` followed by the socket's
absolute path, as ``vllm serve --uds`` names its own listen address. A request's URL is the
node URL with the route appended, as for an http node (``unix:/run/tandem/generate.sock/health``),
so logs, metrics labels and errors name the node as it was given. Where the socket path ends
and the route begins is told by the nodes the transport was built for: it knows their paths.

Not ``http+unix://%2Frun%2F...`` (requests-unixsocket's spelling): httpx lowercases a URL's
host, and socket paths are case-sensitive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import httpx

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "UNIX_PREFIX",
    "UnixSocketTransport",
    "node_client",
    "unix_socket_path",
]

UNIX_PREFIX = "unix:"
"""``unix:/ABSOLUTE/PATH``: the node listens on that Unix-domain socket."""

MAX_SOCKET_PATH_BYTES = 107
"""The longest socket path Linux binds (``sun_path`` holds 108 bytes, its NUL included)."""

_PATH = re.compile(r"[A-Za-z0-9._~@+,=/-]+")
"""Characters a URL carries unchanged: with any other, the path httpx sends (percent-encoded)
would no longer start with the socket path as given."""

_HOST = "localhost"
"""The Host header of requests over a socket (HTTP/1.1 needs one; the node reads none)."""


def unix_socket_path(url: str) -> str:
    """The socket path of a ``unix:/ABSOLUTE/PATH`` node URL; ValueError, naming the URL and
    what is wrong with it, for any other shape."""
    path = url.removeprefix(UNIX_PREFIX)
    if path.startswith("//"):
        raise ValueError(f"{url!r}: a socket node is unix:/ABSOLUTE/PATH, with one slash")
    if not path.startswith("/"):
        raise ValueError(
            f"{url!r}: a socket node needs an absolute path (unix:/run/tandem/generate.sock)"
        )
    segments = path.split("/")[1:]
    if not _PATH.fullmatch(path) or any(s in ("", ".", "..") for s in segments):
        raise ValueError(
            f"{url!r}: a socket path here takes letters, digits and . _ ~ @ + , = - / only, "
            "with no empty, . or .. segment (a URL would rewrite them)"
        )
    if len(path.encode()) > MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"{url!r}: the socket path is longer than the {MAX_SOCKET_PATH_BYTES} bytes "
            "a Unix socket address holds"
        )
    return path


class UnixSocketTransport(httpx.AsyncBaseTransport):
    """Sends each request for a ``unix:`` node over that node's socket, one connection pool
    per socket (as httpx keeps one per origin); mounted at ``unix://`` (``node_client``)."""

    def __init__(self, paths: Iterable[str], limits: httpx.Limits) -> None:
        self._pools = {p: httpx.AsyncHTTPTransport(uds=p, limits=limits) for p in paths}

    def _split(self, url: httpx.URL) -> tuple[str, bytes]:
        """(socket path, the route with its query) of a request URL."""
        raw = url.raw_path
        for path in self._pools:
            head = path.encode()
            if raw == head or raw.startswith((head + b"/", head + b"?")):
                rest = raw[len(head) :]
                return path, rest if rest.startswith(b"/") else b"/" + rest
        raise httpx.UnsupportedProtocol(f"{url}: no node of this client listens on that socket")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path, route = self._split(request.url)
        headers = request.headers.copy()
        headers.setdefault("host", _HOST)
        over_socket = httpx.Request(
            request.method,
            httpx.URL(scheme="http", host=_HOST, raw_path=route),
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        try:
            return await self._pools[path].handle_async_request(over_socket)
        except httpx.RequestError as exc:
            exc.request = request  # the error names the node as it was given
            raise

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()


def node_client(
    urls: Iterable[str], socket_limits: httpx.Limits, **kwargs: Any
) -> httpx.AsyncClient:
    """An httpx client for nodes (``kwargs`` as ``httpx.AsyncClient``'s) that reaches the
    ``unix:`` nodes among ``urls`` over their sockets, a pool each bounded by
    ``socket_limits``."""
    paths = [unix_socket_path(u.rstrip("/")) for u in urls if u.startswith(UNIX_PREFIX)]
    if paths:
        mounts = {
            **(kwargs.get("mounts") or {}),
            "unix://": UnixSocketTransport(paths, socket_limits),
        }
        kwargs["mounts"] = mounts
        # httpx takes a URL with no host (unix:/run/x.sock/health) for a relative one and
        # appends it to base_url: from ``unix:/`` it comes back whole, for the mount above.
        kwargs["base_url"] = "unix:/"
    return httpx.AsyncClient(**kwargs)
