"""Decoding generated media back to pixels: the frames of an MP4 (the realtime routes' last frame,
tests and checks)."""

from __future__ import annotations

import io

import numpy as np


def decode_mp4_frames(data: bytes) -> list[np.ndarray]:
    """RGB uint8 frames of an MP4, in order."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
