"""http(s) media: vet each hop's address, connect to the vetted IP, follow redirects, cap bytes."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx

from ..errors import MediaError, MediaFetchFailed, MediaTooLarge, MediaUrlForbidden
from .addresses import IPAddress, is_allowed_domain, is_public, literal_ip, unmap
from .policy import MediaPolicy

__all__ = ["Charge", "HttpFetcher", "Resolver"]

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Maps ``(host, port)`` to the IP addresses a connection would use."""

Charge = Callable[[int], None]
"""Told of ``n`` more bytes a request is about to hold (a ``Slot.take``); raises to refuse."""

_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
_MAX_URL_ECHO = 100


@dataclass(frozen=True)
class _Target:
    """One vetted http(s) hop: the URL to connect to (host replaced by the vetted IP)."""

    connect_url: httpx.URL
    host_header: str
    sni_hostname: str | None


async def _system_resolver(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _short(text: str) -> str:
    return text if len(text) <= _MAX_URL_ECHO else text[:_MAX_URL_ECHO] + "..."


class HttpFetcher:
    """Fetches http(s) media under a :class:`MediaPolicy`, whose scheme check the caller did.

    Each hop resolves the host first, refuses private addresses, then connects to the vetted
    IP itself (``Host`` header and TLS SNI keep the name), so DNS rebinding cannot redirect the
    connection. The fetcher's own client keeps no idle connections, since its pool is keyed by
    IP and a reused TLS connection would skip the certificate check for a second name on the
    same IP.
    """

    def __init__(
        self,
        policy: MediaPolicy,
        client: httpx.AsyncClient | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.policy = policy
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=policy.fetch_timeout_s,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._resolve = resolver or _system_resolver
        self._private_names = {h.lower() for h in policy.allowed_private_hosts}
        self._private_ips = {
            ip for h in policy.allowed_private_hosts if (ip := literal_ip(h)) is not None
        }

    async def aclose(self) -> None:
        """Close the HTTP client if this fetcher created it."""
        if self._owns_client:
            await self._client.aclose()

    async def fetch(self, url: str, charge: Charge | None = None) -> bytes:
        """The body behind an http(s) ``url``; raises a :class:`MediaError` subclass.
        ``charge`` is told of its bytes before they are held (see ``_read_capped``)."""
        try:
            async with asyncio.timeout(self.policy.fetch_timeout_s):
                return await self._follow(url, charge)
        except (TimeoutError, httpx.TimeoutException):
            raise MediaFetchFailed("timed out fetching media") from None
        except httpx.HTTPError:
            raise MediaFetchFailed("could not fetch media (connection failed)") from None

    async def _follow(self, url: str, charge: Charge | None) -> bytes:
        current = _parse_http_url(url)
        for _ in range(self.policy.max_redirects + 1):
            target = await self._vet(current)
            async with self._client.stream(
                "GET",
                target.connect_url,
                headers={
                    "Host": target.host_header,
                    "User-Agent": self.policy.user_agent,
                    # Compressed bodies would be inflated past the byte cap in one chunk.
                    "Accept-Encoding": "identity",
                },
                extensions={"sni_hostname": target.sni_hostname} if target.sni_hostname else {},
                follow_redirects=False,
            ) as response:
                if response.status_code in _REDIRECT_CODES and "location" in response.headers:
                    current = _redirect_target(current, response.headers["location"])
                    continue
                if not 200 <= response.status_code < 300:
                    raise MediaFetchFailed(f"media server answered HTTP {response.status_code}")
                return await self._read_capped(response, charge)
        raise MediaFetchFailed(f"more than {self.policy.max_redirects} redirects")

    async def _vet(self, url: httpx.URL) -> _Target:
        """Every check for one hop; returns where to connect. Runs again on each redirect."""
        # Only a redirect gets here with a scheme the policy refuses: the caller checked the
        # first URL's.
        if url.scheme not in self.policy.allowed_schemes:
            raise MediaUrlForbidden(f"media redirect to a {url.scheme}: URL is not allowed")
        host = url.raw_host.decode("ascii").lower()
        if self.policy.allowed_domains is not None and not is_allowed_domain(
            host, self.policy.allowed_domains
        ):
            raise MediaUrlForbidden(f"media host is not in the allowlist: {_short(host)}")
        port = url.port or (443 if url.scheme == "https" else 80)
        ip = await self._pick_ip(host, port)
        port_suffix = f":{url.port}" if url.port is not None else ""
        host_in_url = f"[{host}]" if ":" in host else host
        return _Target(
            connect_url=url.copy_with(host=str(ip), port=port),
            host_header=host_in_url + port_suffix,
            sni_hostname=host if url.scheme == "https" else None,
        )

    async def _pick_ip(self, host: str, port: int) -> IPAddress:
        literal = literal_ip(host)
        if literal is not None:
            candidates = [literal]
        else:
            candidates = await self._resolve_host(host, port)
        candidates = [unmap(ip) for ip in candidates]
        if not (self.policy.allow_private_networks or host in self._private_names):
            # Any private answer refuses the name: mixing public and private answers is how
            # rebinding attacks hedge their bets.
            for ip in candidates:
                if not is_public(ip) and ip not in self._private_ips:
                    raise MediaUrlForbidden(
                        f"media host resolves to a private or reserved address: {_short(host)}"
                    )
        return candidates[0]

    async def _resolve_host(self, host: str, port: int) -> list[IPAddress]:
        try:
            answers = await self._resolve(host, port)
        except (OSError, UnicodeError):
            raise MediaFetchFailed(f"could not resolve media host: {_short(host)}") from None
        try:
            ips = [ipaddress.ip_address(a) for a in answers]
        except ValueError:
            raise MediaFetchFailed(f"could not resolve media host: {_short(host)}") from None
        if not ips:
            raise MediaFetchFailed(f"could not resolve media host: {_short(host)}")
        return ips

    async def _read_capped(self, response: httpx.Response, charge: Charge | None) -> bytes:
        """The body, at most the media cap; ``charge`` gets its Content-Length before any of
        it is read, and any bytes past what that said as they arrive."""
        limit = self.policy.max_media_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise MediaTooLarge(f"media is larger than {limit} bytes")
        charged = int(declared) if declared.isdigit() else 0
        if charge is not None and charged:
            charge(charged)
        # We asked for identity. A server sending a compressed body anyway would have it
        # inflated a whole chunk at a time (a few kB of gzip can become gigabytes) before the
        # cap could look, so it is refused; the bytes counted are the bytes received.
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise MediaFetchFailed(
                f"media server sent a {_short(encoding)}-encoded body; only identity is accepted"
            )
        body = bytearray()
        async for chunk in _raw_chunks(response):
            body += chunk
            if len(body) > limit:
                raise MediaTooLarge(f"media is larger than {limit} bytes")
            if charge is not None and len(body) > charged:
                charge(len(body) - charged)
                charged = len(body)
        return bytes(body)


async def _raw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as received; a transport that buffered it already hands it over whole."""
    if response.is_stream_consumed:
        yield response.content
        return
    async for chunk in response.aiter_raw():
        yield chunk


def _parse_http_url(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise MediaError(f"malformed media URL: {_short(url)}") from None
    if not parsed.host:
        raise MediaError(f"media URL has no host: {_short(url)}")
    return parsed


def _redirect_target(current: httpx.URL, location: str) -> httpx.URL:
    try:
        nxt = current.join(location)
    except httpx.InvalidURL:
        raise MediaFetchFailed("media server sent a malformed redirect") from None
    if nxt.scheme not in ("http", "https") or not nxt.host:
        raise MediaUrlForbidden(f"media redirect target is not allowed: {_short(str(nxt))}")
    return nxt
