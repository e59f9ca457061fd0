"""Loads the bytes of image parts (data:, http(s): and file: URLs) safely, and checks images."""

from __future__ import annotations

import asyncio
import binascii
import io
import ipaddress
import re
import socket
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import httpx
import pybase64
from PIL import Image, UnidentifiedImageError

from tandem_render.errors import (
    ImageTooLarge,
    InvalidImage,
    MediaError,
    MediaFetchFailed,
    MediaNotFound,
    MediaSchemeNotAllowed,
    MediaTooLarge,
    MediaUrlForbidden,
)

__all__ = ["MediaPolicy", "MediaLoader", "Resolver", "is_allowed_domain"]

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Maps ``(host, port)`` to the IP addresses a connection would use."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_MAX_SCHEME = 32  # where to stop looking for the ':' of a scheme
_MAX_DATA_URL_HEADER = 1024  # "data:<media type>;<params>;base64" before the ','
# inet_aton also accepts trailing garbage after a space; only hand it things that look numeric.
_LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
_MAX_URL_ECHO = 100


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how much of it is accepted."""

    allowed_schemes: frozenset[str] = frozenset({"http", "https", "data"})
    """URL schemes accepted. ``file`` is accepted if and only if ``allowed_local_media_path`` is
    set, whatever this set says."""
    allowed_domains: tuple[str, ...] | None = None
    """Hosts http(s) media may come from; ``None`` means any public host. An entry matches the
    host itself and its subdomains (``example.com`` matches ``cdn.example.com``)."""
    allow_private_networks: bool = False
    """Allow private, loopback, link-local and reserved addresses (trusted networks only)."""
    allowed_private_hosts: frozenset[str] = frozenset()
    """Host names or IPs exempt from the private-address check (tests, dev: ``127.0.0.1``)."""
    allowed_local_media_path: Path | None = None
    """Folder ``file:`` URLs may read from (symlinks are resolved first); ``None`` refuses
    ``file:``."""
    fetch_timeout_s: float = 10.0
    """Deadline in seconds for one http(s) load: DNS, every redirect hop and the whole body."""
    max_media_bytes: int = 32 * 1024 * 1024
    """Largest media item in bytes, for every scheme."""
    max_redirects: int = 3
    """Redirects followed per http(s) load; more is a fetch failure."""
    max_image_pixels: int = 64 * 1024 * 1024
    """Largest image accepted, as width * height, checked from the header before decoding."""
    user_agent: str = "tandem-render"
    """User-Agent sent with http(s) requests."""


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


def is_allowed_domain(host: str, allowed: Iterable[str]) -> bool:
    """True if ``host`` equals an entry or is a subdomain of one (case-insensitive, ASCII)."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().strip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def _short(text: str) -> str:
    return text if len(text) <= _MAX_URL_ECHO else text[:_MAX_URL_ECHO] + "..."


def _literal_ip(host: str) -> IPAddress | None:
    """The address the OS would connect to if ``host`` is an IP literal, in any spelling."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    # Legacy IPv4 forms (``2130706433``, ``0x7f.1``, ``127.1``) that getaddrinfo would accept:
    # parsed here so they never reach a resolver.
    if _LEGACY_IPV4.fullmatch(host.lower()):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _unmap(ip: IPAddress) -> IPAddress:
    # An IPv4-mapped address reaches the IPv4 host; connect to (and judge) that host.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _is_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64:
            # The well-known NAT64 prefix is "reserved" to ipaddress, yet on IPv6-only networks
            # every IPv4 destination looks like this: judge the embedded IPv4 host instead.
            return _is_public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not _is_public(ip.sixtofour):
            return False
        if ip.is_site_local:
            return False
    # is_global alone misses multicast (and site-local above), so every flag is checked.
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _split_scheme(url: str) -> str:
    # find, not partition: a data URL is megabytes, and partition would copy all of it.
    colon = url.find(":", 0, _MAX_SCHEME)
    scheme = url[:colon].lower()
    if colon < 0 or not _SCHEME.fullmatch(scheme):
        raise MediaSchemeNotAllowed("media URL has no scheme")
    return scheme


def _decode_data_url(url: str, max_bytes: int) -> bytes:
    comma = url.find(",", 0, _MAX_DATA_URL_HEADER)
    if comma < 0:
        raise InvalidImage("malformed data URL: no ',' separator")
    header, payload = url[len("data:") : comma], url[comma + 1 :]
    is_base64 = header.lower().endswith(";base64")
    # Upper bounds of the decoded size, so nothing oversize is ever decoded.
    bound = len(payload) * 3 // 4 if is_base64 else len(payload)
    if bound > max_bytes:
        raise MediaTooLarge(f"data URL is larger than {max_bytes} bytes")
    if not is_base64:
        return unquote_to_bytes(payload)
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("data URL is not valid base64") from None


class MediaLoader:
    """Loads media bytes under a :class:`MediaPolicy`; build one and share it.

    http(s) fetches resolve the host first, refuse private addresses, then connect to the vetted
    IP itself (``Host`` header and TLS SNI keep the name), so DNS rebinding cannot redirect the
    connection. A ``client`` given by the caller must not use proxies (``trust_env=False``): a
    proxy would resolve the name again. The loader's own client keeps no idle connections, since
    its pool is keyed by IP and a reused TLS connection would skip the certificate check for a
    second name on the same IP.
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
            ip for h in policy.allowed_private_hosts if (ip := _literal_ip(h)) is not None
        }

    async def aclose(self) -> None:
        """Close the HTTP client if this loader created it."""
        if self._owns_client:
            await self._client.aclose()

    async def load_bytes(self, url: str) -> bytes:
        """The bytes behind ``url``; raises a :class:`MediaError` subclass when refused."""
        scheme = _split_scheme(url)
        if scheme == "file":
            root = self.policy.allowed_local_media_path
            if root is None:
                raise MediaSchemeNotAllowed("file: media URLs are not enabled on this server")
            return await asyncio.to_thread(self._read_file, url, root)
        if scheme not in self.policy.allowed_schemes:
            raise MediaSchemeNotAllowed(f"media URL scheme {_short(scheme)!r} is not allowed")
        if scheme == "data":
            return _decode_data_url(url, self.policy.max_media_bytes)
        if scheme in ("http", "https"):
            return await self._fetch(url)
        raise MediaSchemeNotAllowed(f"media URL scheme {_short(scheme)!r} is not supported")

    # -- http(s) -------------------------------------------------------------------------------

    async def _fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self.policy.fetch_timeout_s):
                return await self._follow(url)
        except (TimeoutError, httpx.TimeoutException):
            raise MediaFetchFailed("timed out fetching media") from None
        except httpx.HTTPError:
            raise MediaFetchFailed("could not fetch media (connection failed)") from None

    async def _follow(self, url: str) -> bytes:
        current = self._parse_http_url(url)
        for hop in range(self.policy.max_redirects + 1):
            target = await self._vet(current, redirected=hop > 0)
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
                    current = self._redirect_target(current, response.headers["location"])
                    continue
                if not 200 <= response.status_code < 300:
                    raise MediaFetchFailed(f"media server answered HTTP {response.status_code}")
                return await self._read_capped(response)
        raise MediaFetchFailed(f"more than {self.policy.max_redirects} redirects")

    @staticmethod
    def _parse_http_url(url: str) -> httpx.URL:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            raise MediaError(f"malformed media URL: {_short(url)}") from None
        if not parsed.host:
            raise MediaError(f"media URL has no host: {_short(url)}")
        return parsed

    @staticmethod
    def _redirect_target(current: httpx.URL, location: str) -> httpx.URL:
        try:
            nxt = current.join(location)
        except httpx.InvalidURL:
            raise MediaFetchFailed("media server sent a malformed redirect") from None
        if nxt.scheme not in ("http", "https") or not nxt.host:
            raise MediaUrlForbidden(f"media redirect target is not allowed: {_short(str(nxt))}")
        return nxt

    async def _vet(self, url: httpx.URL, *, redirected: bool) -> _Target:
        """Every check for one hop; returns where to connect. Runs again on each redirect."""
        if url.scheme not in self.policy.allowed_schemes:
            if redirected:
                raise MediaUrlForbidden(f"media redirect to a {url.scheme}: URL is not allowed")
            raise MediaSchemeNotAllowed(f"media URL scheme {url.scheme!r} is not allowed")
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
        literal = _literal_ip(host)
        if literal is not None:
            candidates = [literal]
        else:
            candidates = await self._resolve_host(host, port)
        candidates = [_unmap(ip) for ip in candidates]
        if not self._may_skip_ip_check(host):
            # Any private answer refuses the name: mixing public and private answers is how
            # rebinding attacks hedge their bets.
            for ip in candidates:
                if not _is_public(ip) and ip not in self._private_ips:
                    raise MediaUrlForbidden(
                        f"media host resolves to a private or reserved address: {_short(host)}"
                    )
        return candidates[0]

    def _may_skip_ip_check(self, host: str) -> bool:
        return self.policy.allow_private_networks or host in self._private_names

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

    async def _read_capped(self, response: httpx.Response) -> bytes:
        limit = self.policy.max_media_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise MediaTooLarge(f"media is larger than {limit} bytes")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise MediaTooLarge(f"media is larger than {limit} bytes")
        return bytes(body)

    # -- file: ---------------------------------------------------------------------------------

    def _read_file(self, url: str, root: Path) -> bytes:
        """Blocking: runs in a worker thread."""
        root = root.resolve()
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise MediaUrlForbidden("file: URLs may not name a remote host")
        try:
            path = Path(unquote(parts.path)).resolve()
        except (OSError, ValueError, RuntimeError):
            raise MediaUrlForbidden("file: URL does not name a readable path") from None
        # resolve() has followed symlinks, so a link pointing outside the folder fails here.
        if not parts.path.startswith("/") or not path.is_relative_to(root):
            raise MediaUrlForbidden("file: URL is outside the allowed media folder")
        limit = self.policy.max_media_bytes
        try:
            if not path.is_file():
                raise MediaNotFound("media file not found")
            if path.stat().st_size > limit:
                raise MediaTooLarge(f"media file is larger than {limit} bytes")
            with path.open("rb") as f:
                # Read one byte past the cap: the file may have grown since stat().
                data = f.read(limit + 1)
        except OSError:
            raise MediaNotFound("media file not found or not readable") from None
        if len(data) > limit:
            raise MediaTooLarge(f"media file is larger than {limit} bytes")
        return data

    # -- images --------------------------------------------------------------------------------

    def open_image(self, data: bytes) -> Image.Image:
        """Decode ``data`` (first frame of animations), refusing oversize images before decoding.

        The mode is left as stored; converting is the caller's choice.
        """
        img = self._open_checked(data)
        try:
            img.load()
        except (OSError, SyntaxError, ValueError, EOFError):
            raise InvalidImage("image data is corrupt or truncated") from None
        return img

    def check_image_bytes(self, data: bytes) -> tuple[int, int]:
        """``(width, height)`` from the header alone, with the same checks as :meth:`open_image`."""
        img = self._open_checked(data)
        size = img.size
        img.close()
        return size

    def _open_checked(self, data: bytes) -> Image.Image:
        try:
            # Pillow's own bomb guard warns before it errors; both mean "too many pixels". The
            # filter is process-global, so racing threads can at worst leave it set to "error",
            # which is the behaviour wanted anyway.
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageTooLarge("image has too many pixels") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
            raise InvalidImage("data is not a decodable image") from None
        width, height = img.size
        if width <= 0 or height <= 0:
            img.close()
            raise InvalidImage("image has zero width or height")
        if width * height > self.policy.max_image_pixels:
            img.close()
            raise ImageTooLarge(
                f"image is {width}x{height} pixels, more than {self.policy.max_image_pixels}"
            )
        return img
