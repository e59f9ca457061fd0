"""Which hosts and IP addresses media may be fetched from (pure checks, no I/O)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

__all__ = ["IPAddress", "is_allowed_domain", "is_public", "literal_ip", "unmap"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# inet_aton also accepts trailing garbage after a space; only hand it things that look numeric.
_LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_allowed_domain(host: str, allowed: Iterable[str]) -> bool:
    """True if ``host`` equals an entry or is a subdomain of one (case-insensitive, ASCII)."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().strip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def literal_ip(host: str) -> IPAddress | None:
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


def unmap(ip: IPAddress) -> IPAddress:
    """The IPv4 host an IPv4-mapped address reaches (connect to, and judge, that host)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_public(ip: IPAddress) -> bool:
    """True for a globally routable unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64:
            # The well-known NAT64 prefix is "reserved" to ipaddress, yet on IPv6-only networks
            # every IPv4 destination looks like this: judge the embedded IPv4 host instead.
            return is_public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not is_public(ip.sixtofour):
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
