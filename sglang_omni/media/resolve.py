"""Resolving a media host once, checking every address, and pinning the connection to them.

DNS rebinding (a name that answers a public address to the check and a private one to the
connection) is defeated by resolving exactly once per hop: :func:`checked_addresses` resolves
the host, refuses it if *any* answer is not public (unless the host is allowlisted), and the
fetch then connects to those checked addresses only (:func:`pinned_request`), never letting the
HTTP client resolve the name again. The ``Host`` header and the TLS server name (SNI and
certificate check) stay the URL's host name.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from sglang_omni.media.addresses import IPAddress, literal_ip, non_public_kind
from sglang_omni.media.urls import RemoteURL

#: ``resolver(host, port)``: the IP address strings ``host`` resolves to, in preference order.
#: Raises ``OSError`` when the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]

DEFAULT_PORTS = {"http": 80, "https": 443}


class AddressRefused(ValueError):
    """The host resolves to an address remote media may not come from; the message says why."""


class NoAddress(OSError):
    """The host name does not resolve; ``temporary`` when the resolver failed rather than
    answered that the name has no address (DNS did not answer: retrying may succeed)."""

    def __init__(self, message: str, *, temporary: bool = False) -> None:
        super().__init__(message)
        self.temporary = temporary


#: ``getaddrinfo`` errors that are the resolver's answer "this name has no address".
_NO_SUCH_NAME = frozenset(getattr(socket, name) for name in
                          ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY", "EAI_SERVICE")
                          if hasattr(socket, name))


def _temporary(exc: OSError) -> bool:
    return isinstance(exc, socket.gaierror) and exc.errno not in _NO_SUCH_NAME


async def system_resolver(host: str, port: int) -> list[str]:
    """The system resolver (``getaddrinfo``), run off the event loop."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class PinnedAddress:
    """One checked address of a host and how to reach it."""

    ip: IPAddress
    port: int


async def checked_addresses(
    url: RemoteURL, *, allow_private: bool, resolver: Resolver | None = None
) -> list[PinnedAddress]:
    """Resolve ``url``'s host once and return every address it may be fetched from.

    An IP literal is not resolved. Raises :class:`AddressRefused` when, without
    ``allow_private``, any address is not public (all answers are checked, not only the first),
    and :class:`NoAddress` when the name does not resolve.
    """
    port = url.port or DEFAULT_PORTS[url.scheme]
    literal = literal_ip(url.host)
    if literal is not None:
        answers: list[str] = [str(literal)]
    else:
        try:
            answers = await (resolver or system_resolver)(url.host, port)
        except OSError as exc:
            if _temporary(exc):
                raise NoAddress(f"the host {url.host!r} could not be resolved now (the name "
                                "service failed)", temporary=True) from None
            raise NoAddress(f"the host {url.host!r} does not resolve") from None
    addresses: list[PinnedAddress] = []
    for answer in answers:
        try:
            ip = ipaddress.ip_address(answer)
        except ValueError:
            raise AddressRefused(f"the host {url.host!r} resolves to an invalid address") from None
        kind = non_public_kind(ip)
        if kind is not None and not allow_private:
            raise AddressRefused(
                f"the host {url.host!r} resolves to a {kind} address; remote media must be on "
                "a public address (list an internal host with --allowed-media-domain)"
            )
        if PinnedAddress(ip, port) not in addresses:
            addresses.append(PinnedAddress(ip, port))
    if not addresses:
        raise NoAddress(f"the host {url.host!r} does not resolve")
    return addresses


@dataclass(frozen=True)
class PinnedRequest:
    """What to hand the HTTP client: a URL naming the checked IP, plus the logical host."""

    url: str
    headers: dict[str, str]
    extensions: dict[str, str]


def pinned_request(url: RemoteURL, address: PinnedAddress) -> PinnedRequest:
    """The request for ``url`` connecting to ``address`` while keeping Host and TLS server name.

    The URL's authority is replaced by the IP (so the client does no DNS lookup of its own);
    ``Host`` is the original host (with a non-default port), and for ``https`` the
    ``sni_hostname`` request extension makes the TLS handshake send and verify the host name.
    """
    ip = address.ip
    ip_text = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    scheme_len = len(url.scheme) + 3  # "http://"
    rest = url.url[scheme_len:]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
              default=len(rest))
    tail = rest[cut:]
    pinned = f"{url.scheme}://{ip_text}:{address.port}{tail}"
    host = f"[{url.host}]" if ":" in url.host else url.host
    if url.port is not None and url.port != DEFAULT_PORTS[url.scheme]:
        host = f"{host}:{url.port}"
    extensions: dict[str, str] = {}
    if url.scheme == "https" and literal_ip(url.host) is None:
        extensions["sni_hostname"] = url.host
    return PinnedRequest(url=pinned, headers={"Host": host}, extensions=extensions)
