"""The media policy: which media references a request may carry, and how each is read.

One :class:`MediaPolicy` is built from the server flags and used by every route and stage. Its
:meth:`MediaPolicy.resolve` classifies a reference without network I/O (only local path
resolution touches the filesystem) and either refuses it with :class:`MediaRefused` (HTTP 400,
message naming the reference and the rule) or returns a :data:`MediaSource` saying how to read
it. :meth:`MediaPolicy.check` is the same decision for the pre-check every route runs before any
model work. Reading (fetching, decoding, temporary files) lives in :mod:`sglang_omni.media.fetch`.

Rules (``root`` is ``--allowed-local-media-path``, ``domains`` is ``--allowed-media-domain``):

==========================  =================================================================
reference                   decision
==========================  =================================================================
``http(s)://...``           syntax checked (:mod:`.urls`); with ``domains`` set the host must be
                            listed (port not checked) and Omni fetches it itself; without,
                            passed to native SGLang (scheme lowercased)
``file://...``              refused without ``root``; else must resolve inside ``root``
``data:...;base64,...``     decoded (size-limited) into the request's temp folder
any other ``scheme:...``    refused (ftp, gopher, javascript, ...)
bare path / base64 string   without ``root``: passed through, as native SGLang allows; with
                            ``root``: a strict base64 string that names no existing file is
                            inline data (size-limited), anything else a path confined to ``root``
==========================  =================================================================

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
from sglang_omni.media import inline, local, urls

#: Native SGLang's default ``--media-url-max-file-size-mb`` (sglang 0.5.23,
#: ``sglang/srt/arg_groups/fields/mm.py``; also ``_DEFAULT_MEDIA_URL_MAX_FILE_SIZE_MB`` in
#: ``sglang/srt/utils/common.py``). In MiB; 0 disables the limit.
NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB = 64

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PREVIEW_CHARS = 80
_PATH_MAX = 4096  # Linux PATH_MAX: no longer string can name a file


@dataclass(frozen=True)
class LocalMedia:
    """A local file the engine may open: ``path`` is resolved and inside the allowed root."""

    path: Path


@dataclass(frozen=True)
class RemoteMedia:
    """An ``http(s)`` URL; ``fetch`` is True when Omni must fetch it (an allowlist is set)."""

    url: urls.RemoteURL
    fetch: bool


@dataclass(frozen=True)
class InlineMedia:
    """Base64 media carried in the request (a ``data:`` URL, or bare base64 under a root)."""

    payload: inline.InlinePayload


@dataclass(frozen=True)
class PassThrough:
    """A bare path-or-base64 string native SGLang reads as it always does (no root set)."""

    ref: str


MediaSource: TypeAlias = LocalMedia | RemoteMedia | InlineMedia | PassThrough
_Refuse: TypeAlias = Callable[[str], MediaRefused]


def preview(ref: str) -> str:
    """A short printable form of a reference for error messages."""
    text = ref if len(ref) <= _PREVIEW_CHARS else ref[:_PREVIEW_CHARS] + "..."
    return repr(text)


@dataclass(frozen=True)
class MediaPolicy:
    """Which media references are allowed, and the limits on reading them.

    ``allowed_local_media_path``: the folder local media must resolve into (``None``: ``file://``
    refused, bare paths unrestricted). It is resolved once, at construction, and must exist.
    ``allowed_media_domains``: host allowlist; non-empty means Omni fetches remote media itself
    and checks the host on every redirect. Entries are normalized like native SGLang's.
    ``max_file_size_mb``: limit in MiB on fetched and inline media (0: no limit).
    ``fetch_timeout_s``: connect and per-read stall timeout; ``fetch_deadline_s``: whole fetch,
    redirects included. ``max_redirects``: redirects followed before the fetch fails.
    ``trust_env``: let the HTTP client use proxy settings from the environment.

    Construction raises ``ValueError`` for an invalid setting.
    """

    allowed_local_media_path: Path | None = None
    allowed_media_domains: tuple[str, ...] = ()
    max_file_size_mb: float = NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB
    fetch_timeout_s: float = 10.0
    fetch_deadline_s: float = 60.0
    max_redirects: int = 5
    trust_env: bool = False
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
        if not (self.fetch_timeout_s > 0 and self.fetch_deadline_s > 0):
            raise ValueError("fetch_timeout_s and fetch_deadline_s must be > 0")
        if self.max_redirects < 0:
            raise ValueError("max_redirects must be >= 0")

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
                    raise refuse("file:// URLs need --allowed-local-media-path")
                path = local.file_url_path(ref)
                return LocalMedia(local.confine(path, self.allowed_local_media_path))
            if scheme is not None:
                raise refuse(f"the URL scheme {scheme!r} is not allowed")
            return self._bare(ref, refuse)
        except (urls.URLRejected, local.PathRejected, inline.InlineRejected) as e:
            raise refuse(str(e)) from None

    def _remote(self, ref: str, refuse: _Refuse) -> RemoteMedia:
        url = urls.parse_remote_url(ref)
        if self._domains:
            if url.host not in self._domains:
                raise refuse(
                    f"the host {url.host!r} is not in --allowed-media-domain "
                    f"({', '.join(self.allowed_media_domains)})"
                )
            return RemoteMedia(url, fetch=True)
        return RemoteMedia(url, fetch=False)

    def check_redirect(self, location: str, *, label: str) -> urls.RemoteURL:
        """Validate a redirect target like a fresh reference (scheme, syntax, allowlist)."""

        def refuse(rule: str) -> MediaRefused:
            return MediaRefused(
                f"{label}: redirected to a refused URL: {rule} (to {preview(location)})"
            )

        try:
            url = urls.parse_remote_url(location)
        except urls.URLRejected as e:
            raise refuse(str(e)) from None
        if self._domains and url.host not in self._domains:
            raise refuse(f"the host {url.host!r} is not in --allowed-media-domain")
        return url

    def _inline(self, payload: inline.InlinePayload, refuse: _Refuse) -> InlineMedia:
        if self.over_limit(payload.decoded_size):
            raise refuse(
                f"inline media is larger than the {self.max_file_size_mb:g} MB limit "
                "(media_url_max_file_size_mb)"
            )
        if not inline.is_base64(payload.payload):
            raise refuse("the payload is not valid base64")
        return InlineMedia(payload)

    def _bare(self, ref: str, refuse: _Refuse) -> LocalMedia | InlineMedia | PassThrough:
        root = self.allowed_local_media_path
        if root is None:
            return PassThrough(ref)
        if len(ref) >= _PATH_MAX or (inline.is_base64(ref) and not os.path.lexists(ref)):
            # too long to name a file, or base64 naming none: inline data (size checked first)
            return self._inline(inline.InlinePayload(ref, None), refuse)
        return LocalMedia(local.confine(ref, root))
