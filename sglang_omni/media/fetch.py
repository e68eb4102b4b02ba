"""Reading media under a :class:`~sglang_omni.media.policy.MediaPolicy`.

:func:`materialize` turns an allowed reference into what the native engine should read;
:func:`load_bytes` returns the media bytes themselves (for CPU test engines); :func:`fetch_remote`
is the guarded HTTP fetch both use.

The fetch never lets httpx follow redirects: each hop is validated like a fresh reference (scheme,
syntax, and, while ``--allowed-media-domain`` is set, the host) before it is requested, and at most
``max_redirects`` are followed. It asks for an unencoded body (a compressed one is refused, so the
limit counts the bytes that are stored) and streams it, refusing a declared ``Content-Length`` over
the limit up front and stopping as soon as the bytes read pass the limit. ``fetch_timeout_s`` bounds
connecting and every read (a stalled host), ``fetch_deadline_s`` the whole fetch (a trickling one).

Failures map to the statuses of native SGLang's other chat routes: :class:`MediaFetchFailed`
with 400 when the media host answers 404, 500 when it answers another error, fails, times out,
redirects too often or sends more than the limit; a redirect to a refused URL is
:class:`MediaRefused` (400).
"""

from __future__ import annotations

import functools
import mimetypes
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import anyio
import httpx

from sglang_omni.errors import MediaFetchFailed, MediaRefused
from sglang_omni.media import inline
from sglang_omni.media.policy import (
    InlineMedia,
    LocalMedia,
    MediaPolicy,
    MediaSource,
    PassThrough,
    RemoteMedia,
    preview,
)
from sglang_omni.media.urls import RemoteURL
from sglang_omni.media.workdir import RequestMediaDir

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_HEADERS = {"Accept-Encoding": "identity", "User-Agent": "sglang-omni-media"}


def _limit_text(policy: MediaPolicy) -> str:
    return f"the {policy.max_file_size_mb:g} MB limit (media_url_max_file_size_mb)"


def _suffix_for(mime: str | None, path: str = "") -> str:
    """A file extension for the engine's decoders: from the MIME type, else from a URL path."""
    if mime:
        guessed = mimetypes.guess_extension(mime.split(";", 1)[0].strip().lower())
        if guessed:
            return guessed
    return PurePosixPath(path).suffix.lower()


async def fetch_remote(
    url: RemoteURL, policy: MediaPolicy, sink: Callable[[bytes], object], *, label: str
) -> str | None:
    """GET ``url`` under ``policy``, passing the body to ``sink`` chunk by chunk.

    Returns the response's Content-Type (or ``None``). Checks the host of every redirect target
    against the policy's allowlist when one is set. Raises :class:`MediaRefused` or
    :class:`MediaFetchFailed` as described in the module docstring; ``sink`` may have received a
    partial body when it raises.
    """
    where = f"{label}: fetching {preview(url.url)}"
    try:
        with anyio.fail_after(policy.fetch_deadline_s):
            async with httpx.AsyncClient(
                follow_redirects=False,
                timeout=httpx.Timeout(policy.fetch_timeout_s),
                trust_env=policy.trust_env,
                headers=_HEADERS,
            ) as client:
                return await _follow(client, url, policy, sink, label=label, where=where)
    except TimeoutError:
        raise MediaFetchFailed(
            f"{where} took longer than {policy.fetch_deadline_s:g} s", 500
        ) from None
    except httpx.TimeoutException:
        raise MediaFetchFailed(
            f"{where} timed out (no progress for {policy.fetch_timeout_s:g} s)", 500
        ) from None
    except httpx.HTTPError as e:
        raise MediaFetchFailed(f"{where} failed ({type(e).__name__}: {e})", 500) from None


async def _follow(
    client: httpx.AsyncClient,
    url: RemoteURL,
    policy: MediaPolicy,
    sink: Callable[[bytes], object],
    *,
    label: str,
    where: str,
) -> str | None:
    current = url
    for hop in range(policy.max_redirects + 1):
        async with client.stream("GET", current.url) as response:
            location = response.headers.get("location")
            if response.status_code in REDIRECT_STATUSES and location:
                if hop == policy.max_redirects:
                    raise MediaFetchFailed(
                        f"{where} was redirected more than {policy.max_redirects} times", 500
                    )
                try:
                    target = str(response.url.join(location))
                except (httpx.InvalidURL, ValueError):
                    target = location
                current = policy.check_redirect(target, label=label)
                continue
            if response.status_code == 404:
                raise MediaFetchFailed(f"{where} failed: the media host answered 404", 400)
            if not 200 <= response.status_code < 300:
                raise MediaFetchFailed(
                    f"{where} failed: the media host answered {response.status_code}", 500
                )
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise MediaFetchFailed(
                    f"{where} failed: the media host sent a {encoding!r}-encoded body", 500
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and policy.over_limit(int(declared)):
                raise MediaFetchFailed(
                    f"{where}: the media is larger than {_limit_text(policy)}", 500
                )
            received = 0
            async for chunk in response.aiter_raw():
                received += len(chunk)
                if policy.over_limit(received):
                    raise MediaFetchFailed(
                        f"{where}: the media is larger than {_limit_text(policy)}", 500
                    )
                sink(chunk)
            return response.headers.get("content-type")
    raise AssertionError("unreachable")


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
            content_type = await fetch_remote(url, policy, out.write, label=label)
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


def _write_inline(media: InlineMedia, workdir: RequestMediaDir, *, label: str) -> Path:
    try:
        data = inline.decode(media.payload)
    except inline.InlineRejected as e:
        raise MediaRefused(f"{label}: {e}") from None
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
    if isinstance(source, PassThrough):
        return source.ref
    if isinstance(source, InlineMedia):
        return str(_write_inline(source, workdir, label=label))
    if source.fetch:
        return str(await _fetch_to_file(source.url, policy, workdir, label=label))
    return source.url.url


async def materialize(
    ref: str, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> str:
    """What the native engine should read for ``ref``, or raise like :meth:`MediaPolicy.check`.

    Returns: for local media, the resolved path inside the allowed root; for remote media while
    an allowlist is set, and for ``data:`` URLs (and bare base64 under a root), the path of a
    temporary file inside ``workdir`` (removed on failure or cancellation, else with
    ``workdir``); for ``http(s)`` URLs without an allowlist, the URL (native SGLang fetches it);
    for bare strings without a root, ``ref`` unchanged.
    """
    source = policy.resolve(ref, label=label)
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


async def load_bytes(
    ref: str, policy: MediaPolicy, workdir: RequestMediaDir, *, label: str
) -> bytes:
    """The bytes of the media ``ref`` names, read under ``policy`` (all reads size-limited).

    Like :func:`materialize`, then reads the result; an ``http(s)`` URL without an allowlist is
    fetched here with the same limits (no host check), and a bare string without a root is read
    as a file if one exists, else decoded as base64.
    """
    source = policy.resolve(ref, label=label)
    if isinstance(source, RemoteMedia) and not source.fetch:
        body = bytearray()
        await fetch_remote(source.url, policy, body.extend, label=label)
        return bytes(body)
    if isinstance(source, PassThrough) and not os.path.exists(source.ref):
        if not inline.is_base64(source.ref):
            raise MediaRefused(f"{label}: neither an existing file nor base64 data")
        payload = inline.InlinePayload(source.ref, None)
        if policy.over_limit(payload.decoded_size):
            raise MediaRefused(f"{label}: the media is larger than {_limit_text(policy)}")
        return inline.decode(payload)
    target = await _materialize_source(source, policy, workdir, label=label)
    return await anyio.to_thread.run_sync(
        functools.partial(_read_limited, label=label), target, policy
    )
