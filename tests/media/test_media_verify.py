"""What :func:`sglang_omni.media.verify.verify_media` accepts and refuses, format by format (the
routes' side is in ``tests/media_http/test_media_content.py``)."""

from __future__ import annotations

import asyncio
import base64
import io
import random
import struct
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sglang_omni.errors import MediaFetchFailed, MediaRefused
from sglang_omni.media.encode import encode_mp4
from sglang_omni.media.inline import Base64Reader, InlinePayload
from sglang_omni.media.verify import NotMedia, verify_fetched, verify_inline, verify_media

GARBAGE = random.Random(5).randbytes(2048)
MP4 = encode_mp4([np.full((16, 16, 3), 60 * i, np.uint8) for i in range(3)], 3)


def image(fmt: str, size: tuple[int, int] = (24, 16)) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(1).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (and holds none)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


@pytest.mark.parametrize(("fmt", "name"), [("PNG", "png"), ("JPEG", "jpeg"), ("WEBP", "webp"),
                                           ("GIF", "gif"), ("BMP", "bmp"), ("TIFF", "tiff")])
def test_every_image_format_read_passes(fmt: str, name: str) -> None:
    assert verify_media(image(fmt)) == name


def test_a_video_and_audio_pass() -> None:
    assert verify_media(MP4) == "mp4"
    assert verify_media(b"RIFF\x24\x00\x00\x00WAVEfmt ") == "wav"  # audio: leading bytes only


@pytest.mark.filterwarnings("ignore:Tag data larger than file")
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "TIFF"])  # a BMP's pixels are
def test_an_image_header_followed_by_garbage_is_refused(fmt: str) -> None:  # any bytes
    data = image(fmt)
    with pytest.raises(NotMedia, match="truncated or corrupt"):
        verify_media(data[:40] + GARBAGE)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_a_truncated_image_is_refused(fmt: str) -> None:
    data = image(fmt, (64, 64))
    with pytest.raises(NotMedia, match="truncated or corrupt"):
        verify_media(data[:len(data) // 2])


def test_videos_not_what_they_claim_are_refused() -> None:
    for data in (MP4[:len(MP4) // 2], MP4[:32] + GARBAGE):
        with pytest.raises(NotMedia):
            verify_media(data)


def test_random_bytes_are_none_of_the_formats() -> None:
    with pytest.raises(NotMedia, match="none of PNG"):
        verify_media(GARBAGE)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("side", [10_000, 20_000])  # past PIL's limit, and past twice it
def test_images_past_the_decoders_pixel_limit_are_refused(side: int) -> None:
    with pytest.raises(NotMedia, match="89478485 pixels"):
        verify_media(png_claiming(side, side))


def test_a_file_is_read_like_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.mp4").write_bytes(MP4)
    (tmp_path / "b.png").write_bytes(image("PNG")[:40] + GARBAGE)
    assert verify_media(tmp_path / "a.mp4") == "mp4"
    with pytest.raises(NotMedia):
        verify_media(tmp_path / "b.png")


def test_callers_name_the_field_with_their_status() -> None:
    bad = image("PNG")[:40] + GARBAGE
    payload = InlinePayload(base64.b64encode(bad).decode(), "image/png")
    with pytest.raises(MediaRefused, match=r"^images\[0\]: the inline media is not a readable"):
        asyncio.run(verify_inline("images[0]", payload))
    mp4 = InlinePayload(base64.b64encode(MP4).decode(), None)
    with pytest.raises(MediaRefused, match="expected an image"):
        asyncio.run(verify_inline("input.image.b64_json", mp4, image=True))
    declared = InlinePayload(base64.b64encode(image("GIF")).decode(), "image/png")
    with pytest.raises(MediaRefused, match="declares image/png but its bytes are image/gif"):
        asyncio.run(verify_inline("images[0]", declared))
    with pytest.raises(MediaFetchFailed, match=r"^images\[0\]: fetching 'http://h/a.png' "
                                               "failed: the media host sent no readable"):
        asyncio.run(verify_fetched(bad, label="images[0]", url="http://h/a.png"))


def test_parsing_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The callers parse in a worker thread: the loop's thread never runs the decoders."""
    import threading

    from sglang_omni.media import verify

    threads: list[int] = []

    def recording(media: object) -> str:
        threads.append(threading.get_ident())
        return "png"

    monkeypatch.setattr(verify, "verify_media", recording)

    async def both() -> int:
        await verify_inline("x", InlinePayload(base64.b64encode(b"png").decode(), None))
        await verify_fetched(b"png", label="x", url="http://h/a.png")
        return threading.get_ident()

    loop_thread = asyncio.run(both())
    assert len(threads) == 2 and loop_thread not in threads


def test_inline_payloads_are_parsed_as_they_decode() -> None:
    """A base64 payload reads as its bytes, at any offset (no decoded copy is made to parse
    it); verify_media takes one like bytes."""
    data = random.Random(2).randbytes(1000)
    text = "data:image/png;base64," + base64.b64encode(data).decode()
    payload = InlinePayload(text, "image/png", text.index(",") + 1)
    reader = io.BufferedReader(Base64Reader(payload), 7)
    assert reader.read() == data
    rng = random.Random(3)
    for _ in range(200):
        at, size = rng.randrange(1003), rng.randrange(1003)
        reader.seek(at)
        assert reader.read(size) == data[at:at + size]
    mp4 = InlinePayload(base64.b64encode(MP4).decode(), None)
    assert verify_media(mp4) == "mp4"
    with pytest.raises(NotMedia):
        verify_media(InlinePayload(base64.b64encode(image("PNG")[:40] + GARBAGE).decode(),
                                   None))


def with_chunk(png: bytes, extra: bytes) -> bytes:
    """``png`` with the chunk bytes ``extra`` just before its IEND."""
    end = png.rindex(b"IEND") - 4
    return png[:end] + extra + png[end:]


def test_every_png_chunk_and_its_checksum_are_checked_to_iend() -> None:
    png, data = image("PNG"), random.Random(4).randbytes(3 * 1024 * 1024 + 5)
    good = chunk(b"rndm", data)
    assert verify_media(with_chunk(png, good)) == "png"
    bad_sum = good[:-1] + bytes([good[-1] ^ 1])
    bad_byte = good[:9] + bytes([good[9] ^ 1]) + good[10:]  # in the chunk's first window
    late_byte = good[:-9] + bytes([good[-9] ^ 1]) + good[-8:]  # in its last window
    for broken in (bad_sum, bad_byte, late_byte):
        with pytest.raises(NotMedia, match="bad header checksum in b'rndm'"):
            verify_media(with_chunk(png, broken))
    with pytest.raises(NotMedia, match="broken PNG file"):
        verify_media(with_chunk(png, chunk(b"r-d!", b"x")))
    with pytest.raises(NotMedia, match="truncated or corrupt"):  # ends inside the chunk
        verify_media(with_chunk(png, good)[:len(png) + 1024 * 1024])


def test_a_png_chunk_is_checked_a_window_at_a_time() -> None:
    """Issue 33, 4: PIL's verify reads a chunk whole, in pieces then joined: a 48 MB private
    chunk held 96 MB beside its base64 text. Now a few windows, whatever the chunk's size."""
    png = with_chunk(image("PNG"), chunk(b"rndm", random.Random(6).randbytes(12 * 1024 * 1024)))
    payload = InlinePayload(base64.b64encode(png).decode(), "image/png")
    verify_media(payload)  # what it imports is not counted
    tracemalloc.start()
    try:
        assert verify_media(payload) == "png"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 * 1024 * 1024, f"peak {peak / len(png):.2f}x the image"  # a few windows
