"""Which network addresses remote media may come from, and which host names are IP literals.

A media host must be *public*: an address that routes on the internet. Loopback, private,
link-local, unspecified, multicast, reserved, shared (carrier-grade NAT), documentation and
other special-purpose addresses are not, and neither are IPv6 forms that carry such an IPv4
address (``::ffff:127.0.0.1``, 6to4, Teredo, NAT64). See :func:`is_public`.

:func:`literal_ip` reads a URL host the way the system resolver does when it is an IP literal,
including the legacy IPv4 spellings ``inet_aton`` accepts (``127.1``, ``2130706433``,
``0x7f.0.0.1``, ``0177.0.0.1``), so a check can refuse them before any connection.
"""

from __future__ import annotations

import ipaddress
from typing import TypeAlias

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Host names that always mean this machine (RFC 6761), refused without a DNS lookup.
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def _legacy_ipv4_part(text: str) -> int | None:
    """One dot-separated part of a legacy IPv4 literal (decimal, ``0x`` hex, ``0`` octal)."""
    try:
        if text[:2].lower() == "0x":
            return int(text[2:], 16) if text[2:] else None
        if len(text) > 1 and text.startswith("0"):
            return int(text[1:], 8)
        return int(text, 10) if text.isdigit() else None
    except ValueError:
        return None


def legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` names under ``inet_aton`` rules, or ``None``.

    ``a.b.c.d``, ``a.b.c`` (c fills 16 bits), ``a.b`` (b fills 24 bits) and ``a`` (32 bits),
    each part decimal, ``0x`` hex or ``0``-prefixed octal. A trailing dot is ignored.
    """
    text = host[:-1] if host.endswith(".") else host
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts):
        return None
    values = [_legacy_ipv4_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (5 - len(parts))):  # type: ignore[operator]
        return None
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))  # type: ignore[operator]
    return ipaddress.IPv4Address(number)


def literal_ip(host: str) -> IPAddress | None:
    """The address a URL host names without DNS (``[v6]``, dotted-quad or legacy IPv4)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return legacy_ipv4(host)


def is_local_name(host: str) -> bool:
    """Whether the (normalized) host name always means this machine."""
    name = host.lower().rstrip(".")
    return name in LOCAL_NAMES or name.endswith(".localhost")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def non_public_kind(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (``"loopback"``, ``"private"``...), or ``None``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "link-local"
        inner = _embedded_ipv4(ip)
        if inner is not None:
            kind = non_public_kind(inner)
            if kind is not None:
                return kind
            return None if ip.ipv4_mapped is None else "IPv4-mapped"
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("shared (carrier-grade NAT)", isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED),
        ("reserved", ip.is_reserved),
        ("non-global", not ip.is_global),
    )
    return next((kind for kind, hit in checks if hit), None)


def is_public(ip: IPAddress) -> bool:
    """Whether remote media may be fetched from ``ip`` without an allowlist entry."""
    return non_public_kind(ip) is None
