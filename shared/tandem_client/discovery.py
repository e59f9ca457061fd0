"""Where the nodes are (fixed URLs, or every address of a DNS name) and which may get work.

A node spec is a base URL (``http://10.0.0.7:8200``; ``unix:/run/tandem/generate.sock`` for a
node on a Unix-domain socket, see ``tandem_client.unix_nodes``) or ``dns+http://NAME:PORT``: every
address NAME resolves to (A and AAAA records, the system resolver), each as
``http://ADDRESS:PORT``. A Kubernetes headless Service resolves to its ready pods, so scaling
a StatefulSet adds and removes nodes. ``NodeSource`` resolves again when asked (the door
every ``discovery_interval_s``; tandem_client at its first call once ``interval_s`` has
passed). A failed lookup, or an answer with no address, keeps the name's last good addresses:
a DNS outage, or a moment where no pod is ready, would otherwise empty the fleet, while a node
that is really gone fails over quickly anyway (connection refused: its requests go on to the
next node in their order).

A generate node found later serves only once it holds the fleet's weights
(``tandem_client.fleet.judge``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .unix_nodes import UNIX_PREFIX, unix_socket_path

__all__ = [
    "DNS_PREFIX",
    "NodeSource",
    "Resolve",
    "hosts_file_resolver",
    "node_url",
    "parse_node_spec",
    "system_resolve",
]

log = logging.getLogger("tandem.discovery")

DNS_PREFIX = "dns+"
"""``dns+http://NAME:PORT``: every address NAME resolves to is a node."""

Resolve = Callable[[str, int], Awaitable[Sequence[str]]]
"""(name, port) -> the name's addresses; raises ``OSError`` when it cannot tell."""


@dataclass(frozen=True)
class NodeSpec:
    """One entry of a node list: a fixed URL, or a name to resolve (``name`` set)."""

    text: str
    scheme: str
    name: str | None
    port: int


def parse_node_spec(text: str) -> NodeSpec:
    """A node spec checked: ``http(s)://HOST[:PORT]``, ``unix:/SOCKET/PATH`` or
    ``dns+http://NAME:PORT``."""
    text = text.strip().rstrip("/")
    if text.startswith(UNIX_PREFIX):
        unix_socket_path(text)  # a ValueError names what is wrong
        return NodeSpec(text, "unix", None, 0)
    dns = text.startswith(DNS_PREFIX)
    parts = urlsplit(text.removeprefix(DNS_PREFIX))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{text!r} is not a node URL (http://HOST:PORT, unix:/SOCKET/PATH or "
            "dns+http://NAME:PORT)"
        )
    if dns and parts.scheme != "http":
        # The nodes would be reached by address, which no certificate names.
        raise ValueError(f"{text!r}: discovery takes dns+http:// only")
    if dns and (parts.port is None or parts.path or parts.query):
        raise ValueError(f"{text!r}: a discovered node set is dns+http://NAME:PORT")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return NodeSpec(text, parts.scheme, parts.hostname if dns else None, port)


def node_url(scheme: str, address: str, port: int) -> str:
    """``scheme://address:port``, an IPv6 address in brackets."""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


async def system_resolve(name: str, port: int) -> list[str]:
    """Every address the system resolver gives ``name`` (A and AAAA), sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def hosts_file_resolver(path: str | Path) -> Resolve:
    """Resolves names from a hosts-format file (``ADDRESS NAME...`` lines, ``#`` comments),
    read again at each lookup, in place of DNS: for tests, and hosts with no DNS server."""

    async def resolve(name: str, port: int) -> list[str]:
        text = await asyncio.to_thread(Path(path).read_text)
        found = set()
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and name in fields[1:]:
                found.add(fields[0])
        return sorted(found)

    return resolve


class NodeSource:
    """The current URLs of one tier's nodes: the fixed ones, plus every address of each
    ``dns+`` name as last resolved (``refresh``)."""

    def __init__(
        self,
        specs: Iterable[str],
        *,
        interval_s: float = 10.0,
        resolve: Resolve | None = None,
    ) -> None:
        self.specs = [parse_node_spec(s) for s in specs]
        self.interval_s = interval_s
        self._resolve = resolve or system_resolve
        self._found: dict[str, tuple[str, ...]] = {}  # per dns+ spec: its last good URLs
        self._failing: set[str] = set()
        self._resolved_at = -1e18
        self._lock = asyncio.Lock()

    @property
    def dynamic(self) -> bool:
        """Whether any node comes from a name (the set may change)."""
        return any(s.name for s in self.specs)

    @property
    def urls(self) -> tuple[str, ...]:
        """The nodes now: fixed URLs in the order given, then discovered ones (no repeats)."""
        out: dict[str, None] = {}
        for spec in self.specs:
            for url in self._found.get(spec.text, ()) if spec.name else (spec.text,):
                out[url] = None
        return tuple(out)

    def due(self) -> bool:
        return self.dynamic and time.monotonic() - self._resolved_at >= self.interval_s

    async def refresh(self) -> bool:
        """Resolve every name now; whether the node set changed."""
        async with self._lock:
            before = self.urls
            await asyncio.gather(*(self._lookup(s, s.name) for s in self.specs if s.name))
            self._resolved_at = time.monotonic()
            return self.urls != before

    async def _lookup(self, spec: NodeSpec, name: str) -> None:
        try:
            addresses = list(await self._resolve(name, spec.port))
            if not addresses:
                raise OSError("the answer holds no address")
            urls = tuple(sorted(node_url(spec.scheme, a, spec.port) for a in addresses))
        except (OSError, ValueError) as exc:  # ValueError: not an address
            if spec.text not in self._failing:
                kept = len(self._found.get(spec.text, ()))
                log.warning("%s did not resolve (%s): keeping its %d nodes", spec.text, exc, kept)
            self._failing.add(spec.text)
            return
        if spec.text in self._failing:
            self._failing.discard(spec.text)
            log.info("%s resolves again", spec.text)
        if urls != self._found.get(spec.text):
            log.info("%s: %d nodes: %s", spec.text, len(urls), ", ".join(urls))
        self._found[spec.text] = urls
