"""Whether a medium's bytes are what they claim, parsed beyond their leading bytes.

:func:`verify_media` opens the bytes as an engine would. An image (PNG, JPEG, WebP, GIF, BMP,
TIFF) is opened with PIL: its header parsed, its dimensions within PIL's decompression-bomb limit
(``Image.MAX_IMAGE_PIXELS``, the limit every engine's decoder applies); a PNG's chunks are then
read to the end with their checksums (``verify``), any other image is decoded (a JPEG at 1/8
scale). A video container (MP4/QuickTime, WebM/Matroska, AVI) is opened with PyAV: it must hold a
video stream (or, an M4A, an audio one) and its first frame must decode, at a size within the
same limit. Audio files (WAV, MP3, FLAC, Ogg) are known by their leading bytes (:mod:`.sniff`).
Failures raise :class:`NotMedia` with a reason a reader can act on; the callers here name the
field and choose the status: :func:`verify_inline` (a client's bytes: 400) and
:func:`verify_fetched` (a media host's bytes: 500, spec 001's fetch rule).

Parsing costs CPU (up to a decode of one image or one frame): the async callers run it in a
worker thread, never on the event loop. PIL and PyAV are imported where they run.
"""

from __future__ import annotations

import io
import logging
import re
import zlib
from pathlib import Path
from typing import IO

import anyio

from sglang_omni.errors import MediaFetchFailed, MediaRefused
from sglang_omni.media import inline
from sglang_omni.media.policy import preview
from sglang_omni.media.sniff import (
    FORMAT_NAMES,
    HEAD_BYTES,
    MIME_OF_FORMAT,
    declared_format,
    sniff_format,
)

log = logging.getLogger("sglang_omni.media")

#: Sniffed format -> the name PIL gives it (the only plugin tried on those bytes).
IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP",
                 "tiff": "TIFF"}
#: Sniffed formats PyAV probes (their first video frame, else their first audio frame).
CONTAINER_FORMATS = ("mp4", "matroska", "avi")

#: Media to parse: bytes, a file's path, or an inline payload (decoded as it is read).
Media = bytes | bytearray | memoryview | Path | inline.InlinePayload


class NotMedia(ValueError):
    """The bytes are not a readable medium; the message says why (no internal text)."""


def _open(media: Media) -> IO[bytes]:
    if isinstance(media, Path):
        return open(media, "rb")
    if isinstance(media, inline.InlinePayload):
        return io.BufferedReader(inline.Base64Reader(media), 64 * 1024)
    return io.BytesIO(media)


def _head(media: Media) -> bytes:
    if isinstance(media, Path | inline.InlinePayload):
        with _open(media) as f:
            return f.read(HEAD_BYTES)
    return bytes(media[:HEAD_BYTES])


def _pixel_limit() -> int | None:
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return int(limit) if limit else None


def _check_size(width: int, height: int, what: str) -> None:
    if width < 1 or height < 1:
        raise NotMedia(f"its {what} has no pixels ({width}x{height})")
    limit = _pixel_limit()
    if limit is not None and width * height > limit:
        raise NotMedia(f"its {what} is {width}x{height}, more than the {limit} pixels image "
                       "decoders read; send a smaller one")


def _verify_image(media: Media, found: str) -> None:
    from PIL import Image

    name = IMAGE_FORMATS[found]
    try:
        with _open(media) as f, Image.open(f, formats=[name]) as image:
            _check_size(*image.size, "image")
            if found == "png":  # every chunk and its checksum, up to IEND
                _verify_png_chunks(f, image.tile[0][2] - 8 if image.tile else 8)
            else:
                if found == "jpeg":
                    image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
                image.load()
    except NotMedia:
        raise
    except Image.DecompressionBombError:  # PIL's own refusal, past twice its limit
        raise NotMedia(f"its image has more than the {_pixel_limit()} pixels image decoders "
                       "read; send a smaller one") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the decoder on these bytes
        log.debug("a %s image did not parse: %r", name, exc)
        raise NotMedia(f"its bytes start as {name} but the image is truncated or corrupt "
                       f"({_reason(exc)})") from None


#: Bytes of a PNG chunk read at a time to check its checksum.
_CHUNK_WINDOW = 1024 * 1024
_CHUNK_TYPE = re.compile(rb"[A-Za-z0-9_]{4}")


def _verify_png_chunks(f: IO[bytes], start: int) -> None:
    """What PIL's ``verify`` checks of a PNG (every chunk from the first image data chunk,
    at ``start``, to IEND: its type and its checksum), reading a chunk a window at a time:
    PIL reads each chunk whole, in pieces then joined (a 48 MB private chunk took 96 MB)."""
    f.seek(start)
    while True:
        head = f.read(8)
        if len(head) < 8:
            raise SyntaxError("truncated PNG file")
        length, kind = int.from_bytes(head[:4], "big"), head[4:]
        if not _CHUNK_TYPE.fullmatch(kind):
            raise SyntaxError(f"broken PNG file (chunk {kind!r})")
        if kind == b"IEND":
            return
        crc, left = zlib.crc32(kind), length
        while left:
            block = f.read(min(left, _CHUNK_WINDOW))
            if not block:
                raise SyntaxError("Truncated File Read")
            crc, left = zlib.crc32(block, crc), left - len(block)
        stored = f.read(4)
        if len(stored) < 4:
            raise SyntaxError(f"broken PNG file (incomplete checksum in {kind!r})")
        if crc != int.from_bytes(stored, "big"):
            raise SyntaxError(f"broken PNG file (bad header checksum in {kind!r})")


def _reason(exc: BaseException) -> str:
    """A decoder's own words, without errno prefixes or object names (at most 80 characters)."""
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "its header does not parse"
    text = str(exc).split("] ", 1)[-1] if str(exc).startswith("[Errno") else str(exc)
    text = re.sub(r"<[^>]*>", "", text).strip()
    return (text or type(exc).__name__)[:80]


def _first_frame(media: Media, flush: bool) -> bool:
    """Whether the first stream's first frame decodes. ``flush``: decode the first packet
    alone and flush the decoder, so the frame comes out without decoding the frames a
    reordering decoder holds back; else decode packets until a frame comes out."""
    import av

    with _open(media) as f, av.open(f, "r") as container:
        streams = container.streams.video or container.streams.audio
        if not streams:
            raise NotMedia("its container holds no video or audio stream (truncated or "
                           "corrupt)")
        stream = streams[0]
        context = stream.codec_context
        context.thread_count = 1  # frame threads would hold the first frame back
        width, height = getattr(context, "width", 0), getattr(context, "height", 0)
        if stream.type == "video" and width and height:
            _check_size(width, height, "video frame")
        for packet in container.demux(stream):
            if packet.size == 0:
                continue  # the demuxer's end-of-stream marker
            if context.decode(packet):
                return True
            if flush:
                return bool(context.decode(None))
    return False


def _verify_container(media: Media, found: str) -> None:
    try:
        # a stream whose first packet alone makes no frame (rare) is decoded on until one does
        if _first_frame(media, flush=True) or _first_frame(media, flush=False):
            return
    except NotMedia:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the demuxer or decoder
        log.debug("a %s container did not parse: %r", found, exc)
        raise NotMedia("its bytes start as a video container but it is truncated or corrupt "
                       "(it cannot be opened, or its first frame does not decode)") from None
    raise NotMedia("its container holds no frame that decodes")


def verify_media(media: Media) -> str:
    """The format (a :data:`~sglang_omni.media.sniff.MIME_OF_FORMAT` key) of ``media`` (bytes,
    a file's path, or a strict base64 payload) once parsed as the module docstring says;
    :class:`NotMedia` otherwise. CPU-bound: call it off the event loop."""
    found = sniff_format(_head(media))
    if found is None:
        raise NotMedia(f"its bytes are none of {FORMAT_NAMES}")
    if found in IMAGE_FORMATS:
        _verify_image(media, found)
    elif found in CONTAINER_FORMATS:
        _verify_container(media, found)
    return found


def _verify_payload(label: str, payload: inline.InlinePayload, image: bool) -> None:
    if not payload.is_base64():
        raise MediaRefused(f"{label}: the payload is not valid base64 (the standard alphabet, "
                           "correctly padded, without whitespace)")
    try:
        found = verify_media(payload)  # decoded as it is parsed: no decoded copy is held
    except NotMedia as exc:
        raise MediaRefused(f"{label}: the inline media is not a readable image or video: "
                           f"{exc}; send the file as it is") from None
    if image and found not in IMAGE_FORMATS:
        raise MediaRefused(f"{label}: expected an image, got {MIME_OF_FORMAT[found][0]} bytes; "
                           "send a PNG, JPEG, WebP, GIF, BMP or TIFF")
    declared = declared_format(payload.mime)
    if declared is not None and declared != found:
        raise MediaRefused(f"{label}: the data: URL declares {payload.mime} but its bytes are "
                           f"{MIME_OF_FORMAT[found][0]}; declare the type the bytes are")


async def verify_inline(label: str, payload: inline.InlinePayload, *, image: bool = False
                        ) -> None:
    """400 (:class:`MediaRefused` naming ``label``) unless the client's inline ``payload`` is
    strict base64 of a medium :func:`verify_media` reads (an image when ``image``), of the
    format its ``data:`` URL declares; decoded and parsed off the loop."""
    await anyio.to_thread.run_sync(_verify_payload, label, payload, image)


async def verify_fetched(media: bytes | bytearray | Path, *, label: str, url: str) -> None:
    """500 (:class:`MediaFetchFailed` naming ``label`` and the URL) unless the bytes a media
    host sent for ``url`` are a medium :func:`verify_media` reads: the host failed to send
    media (spec 001's fetch rule). Parsed off the loop."""
    try:
        await anyio.to_thread.run_sync(verify_media, media)
    except NotMedia as exc:
        raise MediaFetchFailed(f"{label}: fetching {preview(url)} failed: the media host sent "
                               f"no readable image or video: {exc}") from None
