"""Deterministic synthetic media for the scripted generator: PNG images and H.264 MP4 videos.

Pixels are a pure function of (prompt, seed, width, height, frame index), so tests can compare
what they get with what they asked for.
"""

from __future__ import annotations

import hashlib
import io
from fractions import Fraction

import numpy as np
from PIL import Image


def frame_pixels(prompt: str, seed: int, width: int, height: int, index: int) -> np.ndarray:
    """An RGB uint8 frame: a colour from the prompt and seed, a gradient, a moving band."""
    digest = hashlib.sha256(f"{prompt}\x00{seed}".encode()).digest()
    base = np.frombuffer(digest[:3], dtype=np.uint8).astype(np.int32)
    ys = np.arange(height, dtype=np.int32)[:, None]
    xs = np.arange(width, dtype=np.int32)[None, :]
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[..., 0] = (base[0] + xs * 255 // max(width - 1, 1)) % 256
    img[..., 1] = (base[1] + ys * 255 // max(height - 1, 1)) % 256
    band = ((xs + index * 8) // 16 % 2) * 64
    img[..., 2] = (base[2] + band + index * 5) % 256
    return img


def encode_png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def encode_mp4(frames: list[np.ndarray], fps: int) -> bytes:
    """H.264 (yuv420p) in MP4; one encoder thread, so the bytes are reproducible."""
    import av

    height, width = frames[0].shape[:2]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        # one thread and no macroblock-tree rate control: x264 otherwise carries state that
        # makes small videos differ between runs
        stream = container.add_stream("libx264", rate=fps,
                                      options={"threads": "1", "x264-params": "no-mbtree=1"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, fps)
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def decode_mp4_frames(data: bytes) -> list[np.ndarray]:
    """RGB frames of an MP4 (used by tests and checks)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

