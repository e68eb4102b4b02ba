"""Remote media URLs: strict parsing and host normalization.

A remote reference is accepted only when it parses the same way under two independent parsers
(``urllib.parse`` and httpx, the client that fetches it), so a URL cannot mean one host to the
check and another to the fetch. The accepted syntax is deliberately narrow:

* scheme ``http`` or ``https`` (any case), with an authority (``//host``);
* ASCII only, no whitespace, control characters or backslashes anywhere (percent-encode paths,
  write internationalized hosts in their ``xn--`` form);
* no userinfo (``user@``, ``user:pass@``): ``http://allowed@evil/`` is refused outright;
* a host that is a DNS name (letters, digits, ``-``, ``_``, dot-separated labels), a dotted-quad
  IPv4 address or a bracketed IPv6 address (no zone id); a port, if any, in 1..65535.

Host normalization matches native SGLang's ``--allowed-media-domain`` handling (lowercase, one
trailing dot dropped, IP literals in canonical form, allowlist entries IDNA-encoded); see
:func:`normalize_media_domain`. Forms that merely *resolve* to an allowed address (``127.1``,
``2130706433``, ``::ffff:127.0.0.1``) are compared as written and so fail closed. Which
*addresses* a host may have is decided elsewhere (:mod:`.addresses`, :mod:`.resolve`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

REMOTE_SCHEMES = frozenset({"http", "https"})

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_FORBIDDEN_CHARS_RE = re.compile(r"[\x00-\x20\x7f\\]")


class URLRejected(ValueError):
    """A URL outside the accepted syntax; the message states the rule it breaks."""


@dataclass(frozen=True)
class RemoteURL:
    """A validated ``http(s)`` URL.

    ``url`` is the reference with its scheme lowercased (otherwise as given); ``host`` is the
    normalized host compared against the allowlist; ``port`` is the explicit port or ``None``.
    """

    url: str
    scheme: str
    host: str
    port: int | None


def normalize_host(host: str) -> str:
    """Normalize a URL host for comparison: lowercase, trailing dot dropped, IPs canonical.

    Raises :class:`URLRejected` for anything that is not a DNS name or an IP literal.
    """
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        if "%" in inner:
            raise URLRejected("IPv6 zone identifiers are not allowed in media URLs")
        try:
            return str(ipaddress.IPv6Address(inner))
        except ValueError:
            raise URLRejected(f"{host!r} is not a valid IPv6 address") from None
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > 253 or not _HOSTNAME_RE.match(name):
        raise URLRejected(f"{host!r} is not a valid host name")
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        return name


def normalize_media_domain(entry: str) -> str:
    """Normalize one ``--allowed-media-domain`` entry the way native SGLang does.

    Hostname only: scheme, path, userinfo and port are errors (native SGLang refuses ports too, so
    one flag value means the same on every route). Brackets around IPv6 are dropped, IP literals
    are canonicalized, names are IDNA-encoded and lowercased. Raises ``ValueError``.
    """
    if not isinstance(entry, str):
        raise ValueError("allowed media domains must be strings")
    domain = entry.strip().rstrip(".")
    if not domain:
        raise ValueError("allowed media domains cannot be empty")
    if "://" in domain or any(c in domain for c in "/?#@\\"):
        raise ValueError(f"invalid allowed media domain {entry!r}: give a host name only")
    if domain.startswith("[") and domain.endswith("]"):
        domain = domain[1:-1]
    try:
        return str(ipaddress.ip_address(domain))
    except ValueError:
        if ":" in domain:
            raise ValueError(
                f"invalid allowed media domain {entry!r}: ports are not supported "
                "(the port of a media URL is not checked)"
            ) from None
    try:
        ascii_name = domain.encode("idna").decode("ascii").lower()
    except UnicodeError as e:
        raise ValueError(f"invalid allowed media domain {entry!r}") from e
    try:
        return normalize_host(ascii_name)
    except URLRejected as e:
        raise ValueError(f"invalid allowed media domain {entry!r}: {e}") from None


def _split_authority(netloc: str) -> tuple[str, int | None]:
    """Split ``host[:port]`` (no userinfo) into the raw host and port."""
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise URLRejected("unterminated IPv6 address")
        host, rest = netloc[: end + 1], netloc[end + 1 :]
    else:
        host, sep, port_text = netloc.partition(":")
        rest = sep + port_text
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:].isdigit() or not rest[1:].isascii():
        raise URLRejected("the port must be a number")
    port = int(rest[1:])
    if not 0 < port < 65536:
        raise URLRejected("the port must be in 1..65535")
    return host, port


def parse_remote_url(ref: str) -> RemoteURL:
    """Validate an ``http(s)`` media URL (syntax only; no allowlist, no I/O).

    Raises :class:`URLRejected` naming the broken rule. See the module docstring for the rules.
    """
    if not ref.isascii():
        raise URLRejected(
            "media URLs must be ASCII (percent-encode the path, use the xn-- form of the host)"
        )
    if _FORBIDDEN_CHARS_RE.search(ref):
        raise URLRejected("media URLs must not contain whitespace, control characters or '\\'")
    try:
        parts = urlsplit(ref)
    except ValueError as e:
        raise URLRejected(f"not a valid URL ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in REMOTE_SCHEMES:
        raise URLRejected(f"scheme {parts.scheme!r} is not allowed (only http and https)")
    if not ref[len(scheme) + 1 :].startswith("//") or not parts.netloc:
        raise URLRejected("the URL has no host")
    if "@" in parts.netloc:
        raise URLRejected("user names and passwords ('user@host') are not allowed in media URLs")
    raw_host, port = _split_authority(parts.netloc)
    host = normalize_host(raw_host)
    url = scheme + ref[len(scheme) :]
    # Second opinion: the parser of the client that will fetch the URL must agree.
    import httpx  # here: importing it costs every process at start-up, most never parse a URL

    try:
        theirs = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as e:
        raise URLRejected(f"not a valid URL ({e})") from None
    their_host = theirs.raw_host.decode("ascii")
    if ":" in their_host:
        their_host = f"[{their_host}]"
    try:
        agreed = normalize_host(their_host) == host
    except URLRejected:
        agreed = False
    if not agreed or theirs.scheme != scheme or theirs.userinfo or theirs.port not in (None, port):
        raise URLRejected("the URL is ambiguous (parsers disagree on its host)")
    return RemoteURL(url=url, scheme=scheme, host=host, port=port)
