"""The media checks every route awaits at admission, before any stage runs.

:func:`~sglang_omni.media.refs.check_media_refs` judges the references themselves with no
network I/O; :func:`admit_media` then resolves the host of every remote reference once, so a
host name that resolves to a non-public address (without ``--allowed-media-domain``) or does not
resolve at all is refused with the same 400 on every route, whichever stage would fetch it and
whether or not its engine reads it. The fetch itself resolves again and connects only to the
addresses it checked (:mod:`.resolve`), so this check is about the answer, not the defence.

Inline media (``data:`` URLs, bare base64, form uploads, a realtime first frame, the action
route's ``{"b64_json": ...}`` images) are checked for what their bytes are: first from their
leading bytes (:mod:`.sniff`), then parsed whole, off the event loop (:mod:`.verify`: an image's
header, dimensions and data, a video's container and first frame). Bytes of no image or video
format this server reads, truncated or corrupt media, or bytes of another format than a
``data:`` URL declares (GIF bytes sent as ``image/png``), are a 400 naming the field. A bare
string that reads as a path (``/dev/urandom``, ``//etc/passwd`` are also valid base64) and whose
bytes are no media is a path, refused like any local path. (Remote media are checked the same
way once fetched, by the fetch: :mod:`.fetch`.)

A lookup that fails for a reason of the resolver's (``EAI_AGAIN``: DNS did not answer) is not
the client's doing: :class:`~sglang_omni.errors.MediaFetchFailed` (500). The whole admission
check takes at most the policy's ``fetch_timeout_s``.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterable

import anyio

from sglang_omni.errors import MediaFetchFailed, MediaRefused
from sglang_omni.media import local
from sglang_omni.media.inline import InlineRejected, inline_payload
from sglang_omni.media.policy import (
    NO_LOCAL_MEDIA,
    InlineMedia,
    MediaPolicy,
    RemoteMedia,
    preview,
)
from sglang_omni.media.resolve import AddressRefused, NoAddress, Resolver, checked_addresses
from sglang_omni.media.sniff import (
    FORMAT_NAMES,
    HEAD_BYTES,
    MIME_OF_FORMAT,
    declared_format,
    sniff_format,
)
from sglang_omni.media.stats import MEDIA_STATS
from sglang_omni.media.verify import verify_inline

#: Base64 characters that decode to at least :data:`HEAD_BYTES` bytes (a multiple of 4).
_HEAD_CHARS = -(-HEAD_BYTES // 3) * 4
#: How a bare reference that is a path starts.
_PATH_STARTS = ("/", "./", "../", "~")


async def admit_media(refs: Iterable[tuple[str, str]], policy: MediaPolicy, *,
                      resolver: Resolver | None = None,
                      inline_images: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse (400) the request when the host of any remote ``(label, ref)`` resolves to an
    address the policy refuses, or to none, or when inline media are not what they claim (see
    the module contract); the references were already checked by
    :func:`~sglang_omni.media.refs.check_media_refs`. ``inline_images``: ``(label, text)`` of
    images sent inline outside a reference (a ``data:`` URL or bare base64: the action route's
    ``{"b64_json": ...}``), checked like inline references."""
    remote: list[tuple[str, RemoteMedia]] = []
    try:
        for label, ref in refs:
            source = policy.resolve(ref, label=label)
            if isinstance(source, RemoteMedia):
                remote.append((label, source))
            elif isinstance(source, InlineMedia):
                check_inline_content(label, ref, source, policy)
                await verify_inline(label, source.payload)
        for label, text in inline_images:
            try:
                payload = inline_payload(text)
            except InlineRejected as exc:
                raise MediaRefused(f"{label}: {exc}") from None
            await verify_inline(label, payload, image=True)
    except MediaRefused:
        MEDIA_STATS.refused("policy")
        raise
    if not remote:
        return
    label = remote[0][0]
    try:
        with anyio.fail_after(policy.fetch_timeout_s):
            for label, source in remote:
                await _check_host(label, source, resolver)
    except TimeoutError:
        MEDIA_STATS.refused("timeout")
        raise MediaFetchFailed(f"{label}: resolving the media host took longer than "
                               f"{policy.fetch_timeout_s:g} s; retry shortly") from None


async def _check_host(label: str, source: RemoteMedia, resolver: Resolver | None) -> None:
    got = f"(got {preview(source.url.url)})"
    try:
        await checked_addresses(source.url, allow_private=source.allow_private,
                                resolver=resolver)
    except AddressRefused as exc:
        MEDIA_STATS.refused("policy")
        raise MediaRefused(f"{label}: {exc} {got}") from None
    except NoAddress as exc:
        if exc.temporary:
            MEDIA_STATS.refused("failed")
            raise MediaFetchFailed(f"{label}: {exc}; retry shortly {got}") from None
        MEDIA_STATS.refused("policy")
        raise MediaRefused(f"{label}: {exc}; check the URL's host name {got}") from None


def check_inline_content(label: str, ref: str, media: InlineMedia, policy: MediaPolicy) -> None:
    """400 unless the leading bytes of ``media`` are an image or video format this server
    reads, and the one its ``data:`` URL declares (when it declares one of them); a bare ``ref``
    that reads as a path gets the local-path refusal instead."""
    head = binascii.a2b_base64(media.payload.head(_HEAD_CHARS))
    found = sniff_format(head)
    # An MPEG audio frame is told by 11 sync bits alone, which many strings decode to
    # ("//etc/passwd" does): for a bare string that reads as a path, that is no evidence.
    weak = found == "mp3" and not head.startswith(b"ID3")
    if found is None or (weak and media.payload.mime is None and ref.startswith(_PATH_STARTS)):
        if media.payload.mime is None and ref.startswith(_PATH_STARTS):
            raise _as_path(label, ref, policy)
        raise MediaRefused(f"{label}: the inline media is not an image or video this server "
                           f"reads: its bytes are none of {FORMAT_NAMES} (got {preview(ref)})")
    declared = declared_format(media.payload.mime)
    if declared is not None and declared != found:
        raise MediaRefused(f"{label}: the data: URL declares {media.payload.mime} but its bytes "
                           f"are {MIME_OF_FORMAT[found][0]}; declare the type the bytes are")


def _as_path(label: str, ref: str, policy: MediaPolicy) -> MediaRefused:
    """The refusal of a bare reference that is a path, as the policy refuses local paths."""
    root = policy.allowed_local_media_path
    if root is None:
        rule = NO_LOCAL_MEDIA.format(what="local paths")
    else:
        try:
            local.confine_file(ref, root)
            rule = f"the file is not an image or video: its bytes are none of {FORMAT_NAMES}"
        except local.PathRejected as exc:
            rule = str(exc)
    return MediaRefused(f"{label}: {rule} (got {preview(ref)})")
