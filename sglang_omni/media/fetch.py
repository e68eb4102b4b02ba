"""Reading media under a :class:`~sglang_omni.media.policy.MediaPolicy`.

:func:`materialize` turns an allowed reference into what the native engine should read;
:func:`load_bytes` returns the media bytes themselves (for CPU test engines); :func:`fetch_remote`
is the guarded HTTP fetch both use. Omni fetches every remote reference itself (native SGLang is
handed a temporary file), so every rule below holds on every route and stage.

The fetch resolves each host once and connects only to the addresses it checked
(:mod:`.resolve`): without an allowlist entry for the host, every address must be public, so
neither a private literal nor DNS rebinding reaches an internal service. It never lets httpx
follow redirects: each hop is validated like a fresh reference (scheme, syntax, host rules,
addresses) before it is requested, and at most ``max_redirects`` are followed. It asks for an
unencoded body (a compressed one fails the fetch, so the limit counts the bytes that are stored)
and streams it, failing on a declared ``Content-Length`` over the limit
(``media_url_max_file_size_mb``) up front and stopping as soon as the bytes read pass it.
``fetch_timeout_s`` bounds connecting and every read (a stalled host), ``fetch_deadline_s`` the
whole fetch, redirects included (a trickling, slowloris host).

An ``https`` fetch verifies the host's certificate against the URL's host name (sent as SNI,
though the connection goes to the pinned address) and the certificate authorities of
:func:`tls_context`: those of ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when the server's environment
sets one (an internal media store's own authority), else the public ones (certifi). A
certificate that does not verify fails the fetch (500) saying so.

Bytes fetched and decoded from inline data are counted per request (on the request's
:class:`RequestMediaDir`) against ``max_media_bytes``: over it is :class:`MediaRefused` (400,
naming ``--server.max_media_bytes``).

Failures are typed as native SGLang's other chat routes answer them (``sglang_omni.errors``
holds their statuses; spec 001's fetch rule): :class:`MediaNotFound` (400) when the media host
answers 404, :class:`MediaFetchFailed` (500) when it answers another error, fails, times out,
redirects too often, sends more than the size limit (declared or sent) or sends a compressed body
(which the fetch did not ask for); a redirect to a refused URL or a host on a refused address is
:class:`MediaRefused` (400). Messages never carry internal exception text; the details go to the
log.
"""

from __future__ import annotations

import functools
import logging
import mimetypes
import os
import ssl
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import certifi

from sglang_omni.errors import MediaFetchFailed, MediaNotFound, MediaRefused
from sglang_omni.media import inline
from sglang_omni.media.policy import (
    MEDIA_BYTES_FLAG,
    InlineMedia,
    LocalMedia,
    MediaPolicy,
    MediaSource,
    RemoteMedia,
    preview,
)
from sglang_omni.media.resolve import (
    AddressRefused,
    NoAddress,
    PinnedAddress,
    Resolver,
    checked_addresses,
    pinned_request,
)
from sglang_omni.media.stats import MEDIA_STATS
from sglang_omni.media.urls import RemoteURL
from sglang_omni.media.verify import verify_fetched
from sglang_omni.media.workdir import RequestMediaDir

if TYPE_CHECKING:  # httpx is imported where a fetch runs: a stage that never fetches
    import httpx  # (or has not yet) does not pay for its import at start-up

log = logging.getLogger("sglang_omni.media")

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The attribute naming a refused or failed fetch's reason for the media metrics
#: (:mod:`.stats`); untagged refusals count as ``policy``, untagged failures as ``failed``.
REASON_ATTR = "media_reason"


def _tagged(exc: Exception, reason: str) -> Exception:
    setattr(exc, REASON_ATTR, reason)
    return exc
_HEADERS = {"Accept-Encoding": "identity", "User-Agent": "sglang-omni-media"}


@functools.lru_cache(maxsize=4)
def tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """The certificate authorities media hosts are verified against: ``cafile``/``capath``
    (``SSL_CERT_FILE``/``SSL_CERT_DIR``) when given, else certifi's. Built once per setting."""
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile or None, capath=capath or None)
    return ssl.create_default_context(cafile=certifi.where())


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _limit_text(policy: MediaPolicy) -> str:
    return (f"the {policy.max_file_size_mb:g} MB limit (media_url_max_file_size_mb); send "
            "smaller media")


def charge(workdir: RequestMediaDir | None, policy: MediaPolicy, size: int, *,
           label: str) -> None:
    """Count ``size`` media bytes against the request's ``max_media_bytes``; 400 when over."""
    if workdir is None:
        return
    workdir.media_bytes += size
    limit = policy.max_media_bytes
    if limit is not None and workdir.media_bytes > limit:
        raise _tagged(MediaRefused(
            f"{label}: the request's media add up to more than {limit} bytes "
            f"({MEDIA_BYTES_FLAG} {limit}); send fewer or smaller media, or raise the limit"
        ), "size")


def _suffix_for(mime: str | None, path: str = "") -> str:
    """A file extension for the engine's decoders: from the MIME type, else from a URL path."""
    if mime:
        guessed = mimetypes.guess_extension(mime.split(";", 1)[0].strip().lower())
        if guessed:
            return guessed
    return PurePosixPath(path).suffix.lower()


async def fetch_remote(
    url: RemoteURL,
    policy: MediaPolicy,
    sink: Callable[[bytes], object],
    *,
    label: str,
    workdir: RequestMediaDir | None = None,
    resolver: Resolver | None = None,
) -> str | None:
    """GET ``url`` under ``policy``, passing the body to ``sink`` chunk by chunk.

    Returns the response's Content-Type (or ``None``). Checks the host and its resolved
    addresses on the first request and every redirect (``resolver``: the DNS lookup, the
    system's by default). Bytes received are counted on ``workdir`` (when given) against
    ``max_media_bytes``. Raises :class:`MediaRefused` or :class:`MediaFetchFailed` as described
    in the module docstring; ``sink`` may have received a partial body when it raises. Each
    fetch is counted in :data:`~sglang_omni.media.stats.MEDIA_STATS`, a refusal or failure by
    its reason.
    """
    received = 0

    def counted(chunk: bytes) -> object:
        nonlocal received
        received += len(chunk)
        MEDIA_STATS.received(len(chunk))
        return sink(chunk)

    try:
        content_type = await _fetch_remote(url, policy, counted, label=label, workdir=workdir,
                                           resolver=resolver)
    except MediaNotFound:
        MEDIA_STATS.refused("not_found")
        raise
    except MediaRefused as exc:
        MEDIA_STATS.refused(getattr(exc, REASON_ATTR, "policy"))
        raise
    except MediaFetchFailed as exc:
        MEDIA_STATS.refused(getattr(exc, REASON_ATTR, "failed"))
        raise
    MEDIA_STATS.fetched(received)
    return content_type


async def _fetch_remote(
    url: RemoteURL,
    policy: MediaPolicy,
    sink: Callable[[bytes], object],
    *,
    label: str,
    workdir: RequestMediaDir | None = None,
    resolver: Resolver | None = None,
) -> str | None:
    import httpx

    where = f"{label}: fetching {preview(url.url)}"
    fetch = _Fetch(policy, sink, label, where, workdir, resolver)
    try:
        with anyio.fail_after(policy.fetch_deadline_s):
            async with httpx.AsyncClient(
                follow_redirects=False,
                timeout=httpx.Timeout(policy.fetch_timeout_s),
                trust_env=policy.trust_env,
                headers=_HEADERS,
                verify=tls_context(os.environ.get("SSL_CERT_FILE"),
                                   os.environ.get("SSL_CERT_DIR")),
            ) as client:
                return await fetch.follow(client, url)
    except TimeoutError:
        raise _tagged(MediaFetchFailed(
            f"{where} took longer than {policy.fetch_deadline_s:g} s (the whole fetch, "
            "redirects included)"
        ), "timeout") from None
    except httpx.TimeoutException:
        raise _tagged(MediaFetchFailed(
            f"{where} timed out (no progress for {policy.fetch_timeout_s:g} s)"
        ), "timeout") from None
    except httpx.ConnectError as e:
        log.info("%s: cannot connect: %r", where, e)
        if _caused_by(e, ssl.SSLCertVerificationError):
            raise MediaFetchFailed(
                f"{where} failed: the media host's TLS certificate did not verify (not for "
                "this host name, or not from a trusted certificate authority; set "
                "SSL_CERT_FILE for an internal one)") from None
        raise MediaFetchFailed(f"{where} failed: cannot connect to the media host") from None
    except httpx.HTTPError as e:
        log.info("%s: failed: %r", where, e)
        raise MediaFetchFailed(
            f"{where} failed: the connection to the media host broke ({type(e).__name__})"
        ) from None


class _Fetch:
    """One fetch: the hops of a redirect chain, each resolved, checked and pinned."""

    def __init__(self, policy: MediaPolicy, sink: Callable[[bytes], object], label: str,
                 where: str, workdir: RequestMediaDir | None, resolver: Resolver | None) -> None:
        self.policy, self.sink, self.label, self.where = policy, sink, label, where
        self.workdir, self.resolver = workdir, resolver
        self.content_type: str | None = None

    async def follow(self, client: httpx.AsyncClient, url: RemoteURL) -> str | None:
        import httpx

        current = RemoteMedia(url, allow_private=self.policy.allowlisted(url.host))
        for hop in range(self.policy.max_redirects + 1):
            location = await self._hop(client, current)
            if location is None:
                return self.content_type
            if hop == self.policy.max_redirects:
                raise MediaFetchFailed(
                    f"{self.where} was redirected more than {self.policy.max_redirects} times"
                )
            try:
                target = str(httpx.URL(current.url.url).join(location))
            except (httpx.InvalidURL, ValueError):
                target = location
            current = self.policy.check_redirect(target, label=self.label)
        raise AssertionError("unreachable")

    async def _addresses(self, media: RemoteMedia) -> list[PinnedAddress]:
        try:
            return await checked_addresses(
                media.url, allow_private=media.allow_private, resolver=self.resolver
            )
        except AddressRefused as e:
            raise MediaRefused(f"{self.label}: {e} (got {preview(media.url.url)})") from None
        except NoAddress as e:  # the same rule as at admission (:mod:`.admission`)
            if e.temporary:
                raise MediaFetchFailed(f"{self.where} failed: {e}") from None
            raise MediaRefused(f"{self.label}: {e}; check the URL's host name (got "
                               f"{preview(media.url.url)})") from None

    async def _hop(self, client: httpx.AsyncClient, media: RemoteMedia) -> str | None:
        """Request one URL; the redirect location, or ``None`` once the body was received."""
        import httpx

        addresses = await self._addresses(media)
        for i, address in enumerate(addresses):
            pinned = pinned_request(media.url, address)
            try:
                async with client.stream("GET", pinned.url, headers=pinned.headers,
                                         extensions=pinned.extensions) as response:
                    return await self._response(response)
            except httpx.ConnectError:
                if i == len(addresses) - 1:
                    raise
        raise AssertionError("unreachable")

    async def _response(self, response: httpx.Response) -> str | None:
        where, policy = self.where, self.policy
        location = response.headers.get("location")
        if response.status_code in REDIRECT_STATUSES and location:
            return location
        if response.status_code == 404:
            raise MediaNotFound(f"{where} failed: the media host answered 404")
        if not 200 <= response.status_code < 300:
            raise MediaFetchFailed(
                f"{where} failed: the media host answered {response.status_code}"
            )
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise MediaFetchFailed(
                f"{where} failed: the media host sent a compressed body (Content-Encoding "
                f"{encoding[:20]!r}) though asked for none; media are read as sent, up to "
                f"{_limit_text(policy)}"
            )
        declared = response.headers.get("content-length", "").strip()
        if declared.isdigit() and declared.isascii():
            if policy.over_limit(int(declared)):
                raise _tagged(MediaFetchFailed(
                    f"{where} failed: the media is larger than {_limit_text(policy)}"
                ), "size")
            if policy.max_media_bytes is not None and self.workdir is not None and \
                    self.workdir.media_bytes + int(declared) > policy.max_media_bytes:
                charge(self.workdir, policy, int(declared), label=self.label)  # raises
        received = 0
        async for chunk in response.aiter_raw():
            received += len(chunk)
            if policy.over_limit(received):
                raise _tagged(MediaFetchFailed(
                    f"{where} failed: the media is larger than {_limit_text(policy)}"
                ), "size")
            charge(self.workdir, policy, len(chunk), label=self.label)
            self.sink(chunk)
        self.content_type = response.headers.get("content-type")
        return None


def _discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # the request's folder removal will take it


async def _fetch_to_file(
    url: RemoteURL, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> Path:
    url_suffix = _suffix_for(None, urlsplit(url.url).path)
    dest = workdir.new_file(url_suffix)
    try:
        with open(dest, "wb") as out:
            content_type = await fetch_remote(url, policy, out.write, label=label,
                                              workdir=workdir)
        await verify_fetched(dest, label=label, url=url.url)  # 500 unless readable media
        if not dest.suffix:
            suffix = _suffix_for(content_type)
            if suffix:
                named = workdir.new_file(suffix)
                os.replace(dest, named)
                dest = named
    except BaseException:
        _discard(dest)
        raise
    return dest


def _decode_inline(media: InlineMedia, policy: MediaPolicy, workdir: RequestMediaDir, *,
                   label: str) -> bytes:
    charge(workdir, policy, media.payload.decoded_size, label=label)
    try:
        return inline.decode(media.payload)
    except inline.InlineRejected as e:
        raise MediaRefused(f"{label}: {e}") from None


def _write_inline(media: InlineMedia, policy: MediaPolicy, workdir: RequestMediaDir, *,
                  label: str) -> Path:
    data = _decode_inline(media, policy, workdir, label=label)
    dest = workdir.new_file(_suffix_for(media.payload.mime))
    try:
        dest.write_bytes(data)
    except BaseException:
        _discard(dest)
        raise
    return dest


async def _materialize_source(
    source: MediaSource, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> str:
    if isinstance(source, LocalMedia):
        return str(source.path)
    if isinstance(source, InlineMedia):  # decoding and writing megabytes: off the loop
        return str(await anyio.to_thread.run_sync(
            functools.partial(_write_inline, label=label), source, policy, workdir))
    return str(await _fetch_to_file(source.url, policy, workdir, label=label))


async def materialize(
    ref: str, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> str:
    """What the native engine should read for ``ref``, or raise like :meth:`MediaPolicy.check`.

    Returns: for local media, the resolved path of the checked file inside the allowed root; for
    remote media, ``data:`` URLs and bare base64, the path of a temporary file inside
    ``workdir`` (removed on failure or cancellation, else with ``workdir``).
    """
    source = await anyio.to_thread.run_sync(functools.partial(policy.resolve, label=label), ref) \
        if len(ref) >= OFF_LOOP_CHARS else policy.resolve(ref, label=label)
    return await _materialize_source(source, policy, workdir, label=label)


def _read_limited(path: str, policy: MediaPolicy, *, label: str) -> bytes:
    """Read a regular file, refusing one over the limit without reading past it."""
    limit = policy.max_bytes
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MediaRefused(f"{label}: cannot open the media file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise MediaRefused(f"{label}: the media path is not a regular file")
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise MediaRefused(f"{label}: the media file is larger than {_limit_text(policy)}")
    return data


#: A media reference this long (inline data) is resolved and decoded in a worker thread: the
#: event loop routes, it does not decode megabytes of base64.
OFF_LOOP_CHARS = 64 * 1024


async def load_bytes(
    ref: str, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> bytes:
    """The bytes of the media ``ref`` names, read under ``policy`` (all reads size-limited).

    Decides like :func:`materialize`; remote media are fetched into memory (same checks and
    limits), inline data decoded, local files read (a file over the size limit is refused
    without reading past it). Bytes fetched or decoded count against ``max_media_bytes``.
    """
    long = len(ref) >= OFF_LOOP_CHARS  # inline data: parsed and decoded off the loop
    source = await anyio.to_thread.run_sync(functools.partial(policy.resolve, label=label), ref) \
        if long else policy.resolve(ref, label=label)
    if isinstance(source, InlineMedia):
        if long:
            return await anyio.to_thread.run_sync(
                functools.partial(_decode_inline, label=label), source, policy, workdir)
        return _decode_inline(source, policy, workdir, label=label)
    return await _read_source(source, policy, workdir, label=label)


async def read_media(
    ref: str, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> bytes | inline.InlinePayload:
    """What :func:`load_bytes` reads, but inline data is not decoded: it is its payload,
    checked under ``policy`` (size, strict base64) and its decoded size counted against
    ``max_media_bytes``, for a reader that decodes it where the bytes are needed (the Reasoner
    stage decodes a client's inline media as they arrive: ``runtime.ipc``), so the server never
    holds a medium's bytes beside its text."""
    source = await anyio.to_thread.run_sync(functools.partial(policy.resolve, label=label), ref) \
        if len(ref) >= OFF_LOOP_CHARS else policy.resolve(ref, label=label)
    if isinstance(source, InlineMedia):
        charge(workdir, policy, source.payload.decoded_size, label=label)
        return source.payload
    return await _read_source(source, policy, workdir, label=label)


async def _read_source(source: RemoteMedia | LocalMedia, policy: MediaPolicy,
                       workdir: RequestMediaDir, *, label: str) -> bytes:
    """The bytes of a remote or local medium (see :func:`load_bytes`)."""
    if isinstance(source, RemoteMedia):
        body = bytearray()
        await fetch_remote(source.url, policy, body.extend, label=label, workdir=workdir)
        await verify_fetched(body, label=label, url=source.url.url)  # 500 unless readable media
        return bytes(body)
    return await anyio.to_thread.run_sync(
        functools.partial(_read_limited, label=label), str(source.path), policy
    )
