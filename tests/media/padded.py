"""Valid media of an exact size whose bulk is random bytes, for tests of large inline media:
the server parses every inline medium at admission, so they must be real media."""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
from PIL import Image

from sglang_omni.media.encode import encode_mp4


def padded_png(size: int, seed: int = 0) -> bytes:
    """A PNG of exactly ``size`` bytes (at least about 120): an 8x8 image with a private
    ``rndm`` chunk of random bytes before its end."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (90, 140, 200)).save(buf, format="PNG")
    png = buf.getvalue()
    end = png.rindex(b"IEND") - 4
    fill = random.Random(seed).randbytes(max(0, size - len(png) - 12))
    chunk = struct.pack(">I", len(fill)) + b"rndm" + fill + \
        struct.pack(">I", zlib.crc32(b"rndm" + fill))
    return png[:end] + chunk + png[end:]


def padded_mp4(size: int, seed: int = 0) -> bytes:
    """An MP4 of exactly ``size`` bytes (at least about 2 KB): a two-frame 16x16 clip followed
    by a ``free`` box of random bytes."""
    clip = encode_mp4([np.full((16, 16, 3), 80, np.uint8)] * 2, 2)
    fill = random.Random(seed).randbytes(max(0, size - len(clip) - 8))
    return clip + struct.pack(">I", len(fill) + 8) + b"free" + fill
