"""The media policy: which media references a request may carry, and how each is read.

One :class:`MediaPolicy` is built from the server flags and used by every route and stage. Its
:meth:`MediaPolicy.resolve` classifies a reference without network I/O (only local path
resolution touches the filesystem) and either refuses it with :class:`MediaRefused` (HTTP 400,
message naming the reference and the rule) or returns a :data:`MediaSource` saying how to read
it. :meth:`MediaPolicy.check` is the same decision for the pre-check every route runs before any
model work. Reading (fetching, decoding, temporary files) lives in :mod:`sglang_omni.media.fetch`.

Secure by default: with no flags, no local file is read and remote media come only from public
addresses. Rules (``root`` is ``--allowed-local-media-path``, ``domains`` is
``--allowed-media-domain``):

==========================  =================================================================
reference                   decision
==========================  =================================================================
``http(s)://...``           syntax checked (:mod:`.urls`); with ``domains`` set the host must be
                            listed (port not checked). An unlisted host must be public: an IP
                            literal in any spelling (``127.1``, ``[::ffff:127.0.0.1]``...) or a
                            ``localhost`` name is refused here, a DNS name when the fetch
                            resolves it (:mod:`.resolve`). A listed host may be private. Omni
                            always fetches remote media itself, so it checks the address it
                            connects to and every redirect.
``file://...``              refused without ``root``; else must resolve inside ``root``
``data:...;base64,...``     decoded (size-limited) into the request's temp folder
any other ``scheme:...``    refused (ftp, gopher, javascript, ...)
bare path / base64 string   a strict base64 string (that, under ``root``, names no existing
                            file) is inline data (size-limited); anything else is a local path:
                            refused without ``root``, else confined to it
==========================  =================================================================

A local path must name an existing regular file (a directory, a device or a missing file is
refused with 400). Request-wide limits (``max_media_parts``, ``max_media_bytes``) are applied by
:mod:`.refs` (count, inline sizes) and by the fetch (bytes received).

A bare string that starts like ``word:`` is read as a URL scheme, so a relative path such as
``a:b.png`` must be written ``./a:b.png``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from sglang_omni.errors import MediaRefused
from sglang_omni.media import addresses, inline, local, urls

#: Native SGLang's default ``--media-url-max-file-size-mb`` (sglang 0.5.23,
#: ``sglang/srt/arg_groups/fields/mm.py``; also ``_DEFAULT_MEDIA_URL_MAX_FILE_SIZE_MB`` in
#: ``sglang/srt/utils/common.py``). In MiB; 0 disables the limit.
NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB = 64

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PREVIEW_CHARS = 80
_PATH_MAX = 4096  # Linux PATH_MAX: no longer string can name a file
#: The server flags that set ``max_media_parts`` / ``max_media_bytes`` (named in refusals).
MEDIA_PARTS_FLAG = "--server.max_media_parts"
MEDIA_BYTES_FLAG = "--server.max_media_bytes"
NO_LOCAL_MEDIA = ("{what} are refused: this server reads no local files; send the media inline "
                  "(data: URL) or by http(s) URL, or start the server with "
                  "--allowed-local-media-path DIR to allow files inside DIR")


@dataclass(frozen=True)
class LocalMedia:
    """A local file the engine may open: ``path`` is resolved and inside the allowed root."""

    path: Path


@dataclass(frozen=True)
class RemoteMedia:
    """An ``http(s)`` URL Omni fetches itself; ``allow_private``: the host is allowlisted, so
    its addresses may be private (an internal media store)."""

    url: urls.RemoteURL
    allow_private: bool


@dataclass(frozen=True)
class InlineMedia:
    """Base64 media carried in the request (a ``data:`` URL, or bare base64 under a root)."""

    payload: inline.InlinePayload


MediaSource: TypeAlias = LocalMedia | RemoteMedia | InlineMedia
_Refuse: TypeAlias = Callable[[str], MediaRefused]


def preview(ref: str) -> str:
    """A short printable form of a reference for error messages."""
    text = ref if len(ref) <= _PREVIEW_CHARS else ref[:_PREVIEW_CHARS] + "..."
    return repr(text)


@dataclass(frozen=True)
class MediaPolicy:
    """Which media references are allowed, and the limits on reading them.

    ``allowed_local_media_path``: the folder local media must resolve into (``None``: no local
    file is read). It is resolved once, at construction, and must exist.
    ``allowed_media_domains``: host allowlist; non-empty means only these hosts are fetched
    (checked on every redirect), and they may resolve to private addresses. Empty means any
    host on a public address. Entries are normalized like native SGLang's.
    ``max_file_size_mb``: limit in MiB on each fetched or inline media (0: no limit).
    ``max_media_parts``: media references one request may carry (``None``: no limit).
    ``max_media_bytes``: bytes one request may fetch or decode from inline data, all parts
    together (``None``: no limit); the server sets both from ``--server.max_media_*``.
    ``fetch_timeout_s``: connect and per-read stall timeout; ``fetch_deadline_s``: whole fetch,
    redirects included; ``request_deadline_s``: all the remote media of one request together
    (:func:`~sglang_omni.media.gather.load_all`). ``max_redirects``: redirects followed before
    the fetch fails.
    ``trust_env``: let the HTTP client use proxy settings from the environment.

    Construction raises ``ValueError`` for an invalid setting.
    """

    allowed_local_media_path: Path | None = None
    allowed_media_domains: tuple[str, ...] = ()
    max_file_size_mb: float = NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB
    fetch_timeout_s: float = 10.0
    fetch_deadline_s: float = 60.0
    request_deadline_s: float = 120.0
    max_redirects: int = 5
    trust_env: bool = False
    max_media_parts: int | None = None
    max_media_bytes: int | None = None
    _domains: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.allowed_local_media_path is not None:
            root = local.resolve_root(self.allowed_local_media_path)
            object.__setattr__(self, "allowed_local_media_path", root)
        if isinstance(self.allowed_media_domains, str):
            raise ValueError("allowed_media_domains must be a sequence of host names")
        domains = tuple(
            sorted({urls.normalize_media_domain(d) for d in self.allowed_media_domains})
        )
        object.__setattr__(self, "allowed_media_domains", domains)
        object.__setattr__(self, "_domains", frozenset(domains))
        if not self.max_file_size_mb >= 0:
            raise ValueError("max_file_size_mb must be >= 0 (0 disables the limit)")
        if not (self.fetch_timeout_s > 0 and self.fetch_deadline_s > 0
                and self.request_deadline_s > 0):
            raise ValueError("fetch_timeout_s, fetch_deadline_s and request_deadline_s must be "
                             "> 0")
        if self.max_redirects < 0:
            raise ValueError("max_redirects must be >= 0")
        if self.max_media_parts is not None and self.max_media_parts < 0:
            raise ValueError("max_media_parts must be >= 0")
        if self.max_media_bytes is not None and self.max_media_bytes < 1:
            raise ValueError("max_media_bytes must be >= 1")

    # --- limits -------------------------------------------------------------------------------
    @property
    def max_bytes(self) -> int | None:
        """The size limit in bytes (MiB as native SGLang counts them), or ``None`` for none."""
        if self.max_file_size_mb == 0:
            return None
        return int(self.max_file_size_mb * 1024 * 1024)

    def over_limit(self, size: int) -> bool:
        """Whether ``size`` bytes exceeds the limit."""
        limit = self.max_bytes
        return limit is not None and size > limit

    def allowlisted(self, host: str) -> bool:
        """Whether the normalized ``host`` is in ``--allowed-media-domain`` (may be private)."""
        return host in self._domains

    # --- decisions -----------------------------------------------------------------------------
    def check(self, ref: str, *, label: str) -> None:
        """Refuse ``ref`` with :class:`MediaRefused` (naming ``label`` and the rule) if not allowed.

        No network I/O; only local paths are resolved. Call before any model work.
        """
        self.resolve(ref, label=label)

    def resolve(self, ref: object, *, label: str) -> MediaSource:
        """Decide how ``ref`` may be read, or raise :class:`MediaRefused`. See the module table."""

        def refuse(rule: str) -> MediaRefused:
            return MediaRefused(f"{label}: {rule} (got {preview(str(ref))})")

        if not isinstance(ref, str):
            raise MediaRefused(f"{label}: a media reference must be a string")
        if not ref:
            raise refuse("the media reference is empty")
        if "\x00" in ref:
            raise refuse("media references must not contain NUL characters")
        match = _SCHEME_RE.match(ref)
        scheme = match.group(1).lower() if match else None
        try:
            if scheme in urls.REMOTE_SCHEMES:
                return self._remote(ref, refuse)
            if scheme == "data":
                return self._inline(inline.parse_data_url(ref), refuse)
            if scheme == "file":
                if self.allowed_local_media_path is None:
                    raise refuse(NO_LOCAL_MEDIA.format(what="file:// URLs"))
                path = local.file_url_path(ref)
                return LocalMedia(local.confine_file(path, self.allowed_local_media_path))
            if scheme is not None:
                raise refuse(f"the URL scheme {scheme!r} is not allowed")
            return self._bare(ref, refuse)
        except (urls.URLRejected, local.PathRejected, inline.InlineRejected) as e:
            raise refuse(str(e)) from None

    def resolve_inline(self, text: str, *, label: str) -> InlineMedia:
        """An image sent inline outside a media reference (the action route's ``{"b64_json":
        text}``: a ``data:`` URL or bare base64, never a path or URL), judged like an inline
        reference: its decoded size against the per-file limit, its base64; else
        :class:`MediaRefused` naming ``label`` and the rule."""

        def refuse(rule: str) -> MediaRefused:
            return MediaRefused(f"{label}: {rule} (got {preview(text)})")

        try:
            return self._inline(inline.inline_payload(text), refuse)
        except inline.InlineRejected as e:
            raise refuse(str(e)) from None

    def _remote(self, ref: str, refuse: _Refuse) -> RemoteMedia:
        return self._remote_url(urls.parse_remote_url(ref), refuse, listing=True)

    def _remote_url(self, url: urls.RemoteURL, refuse: _Refuse, *, listing: bool
                    ) -> RemoteMedia:
        """The host rules of one URL (fresh reference or redirect target)."""
        if self._domains:
            if url.host not in self._domains:
                listed = f" ({', '.join(self.allowed_media_domains)})" if listing else ""
                raise refuse(f"the host {url.host!r} is not in --allowed-media-domain{listed}")
            return RemoteMedia(url, allow_private=True)
        literal = addresses.literal_ip(url.host)
        kind = "local" if addresses.is_local_name(url.host) else \
            None if literal is None else addresses.non_public_kind(literal)
        if kind is not None:
            raise refuse(
                f"the host {url.host!r} is a {kind} address; remote media must be on a public "
                "address (list an internal host with --allowed-media-domain)"
            )
        return RemoteMedia(url, allow_private=False)

    def check_redirect(self, location: str, *, label: str) -> RemoteMedia:
        """Validate a redirect target like a fresh reference (scheme, syntax, host rules)."""

        def refuse(rule: str) -> MediaRefused:
            return MediaRefused(
                f"{label}: redirected to a refused URL: {rule} (to {preview(location)})"
            )

        try:
            url = urls.parse_remote_url(location)
        except urls.URLRejected as e:
            raise refuse(str(e)) from None
        return self._remote_url(url, refuse, listing=False)

    def _inline(self, payload: inline.InlinePayload, refuse: _Refuse) -> InlineMedia:
        if self.over_limit(payload.decoded_size):
            raise refuse(
                f"inline media is larger than the {self.max_file_size_mb:g} MB limit "
                "(media_url_max_file_size_mb)"
            )
        if not payload.is_base64():
            raise refuse("the payload is not valid base64")
        return InlineMedia(payload)

    def _bare(self, ref: str, refuse: _Refuse) -> LocalMedia | InlineMedia:
        root = self.allowed_local_media_path
        if root is None:
            if len(ref) >= _PATH_MAX or inline.is_base64(ref):
                return self._inline(inline.InlinePayload(ref, None), refuse)
            raise refuse(NO_LOCAL_MEDIA.format(what="local paths"))
        if len(ref) >= _PATH_MAX or (inline.is_base64(ref) and not os.path.lexists(ref)):
            # too long to name a file, or base64 naming none: inline data (size checked first)
            return self._inline(inline.InlinePayload(ref, None), refuse)
        return LocalMedia(local.confine_file(ref, root))
