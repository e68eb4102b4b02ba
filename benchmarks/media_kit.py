"""Large valid media of an exact size, for the benchmarks that send big inline media.

The server parses every inline medium at admission (``sglang_omni.media.verify``), so bytes that
only start like a PNG or an MP4 are refused. :func:`padded_png` and :func:`padded_mp4` are real
media, a small image or clip, carrying random (incompressible) bytes where their formats allow
private data: a PNG's private ancillary chunk (with its checksum), an MP4's ``free`` box.
"""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
from PIL import Image

from sglang_omni.media.encode import encode_mp4


def _png(side: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (90, 140, 200)).save(buf, format="PNG")
    return buf.getvalue()


def padded_png(size: int) -> bytes:
    """A valid PNG of exactly ``size`` bytes (at least about 120): an 8x8 image with a private
    ``rndm`` chunk of random bytes before its end."""
    png = _png()
    end = png.rindex(b"IEND") - 4  # the IEND chunk: length, type, checksum
    fill = os.urandom(max(0, size - len(png) - 12))
    chunk = struct.pack(">I", len(fill)) + b"rndm" + fill + \
        struct.pack(">I", zlib.crc32(b"rndm" + fill))
    return png[:end] + chunk + png[end:]


def padded_mp4(size: int) -> bytes:
    """A valid MP4 of exactly ``size`` bytes (at least about 2 KB): a two-frame 16x16 H.264
    clip followed by a ``free`` box of random bytes."""
    clip = encode_mp4([np.full((16, 16, 3), 80, np.uint8)] * 2, 2)
    fill = os.urandom(max(0, size - len(clip) - 8))
    return clip + struct.pack(">I", len(fill) + 8) + b"free" + fill
