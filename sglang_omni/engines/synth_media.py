"""Deterministic synthetic media for the scripted generator and tests: frame pixels, encoded
with ``media.encode``, and ``media.decode``'s MP4 frame decoder (both re-exported here).

Pixels are a pure function of (prompt, seed, width, height, frame index), so tests can compare
what they get with what they asked for.
"""

from __future__ import annotations

import hashlib

import numpy as np

from sglang_omni.media.decode import decode_mp4_frames
from sglang_omni.media.encode import encode_mp4, encode_png

__all__ = ["decode_mp4_frames", "encode_mp4", "encode_png", "frame_pixels"]


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
