"""Encoders for generated media: PNG images and H.264 MP4 videos (optionally with AAC sound).

Both are reproducible: the same pixels (and sound) give the same bytes on every run.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any


def encode_png(pixels: Any) -> bytes:
    """An RGB uint8 array (height, width, 3) as PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def encode_mp4(frames: list[Any], fps: int, sound: Any = None,
               sample_rate: int | None = None) -> bytes:
    """RGB uint8 frames as H.264 (yuv420p) in MP4, with the ``sound`` waveform (channels,
    samples) in [-1, 1] as an AAC track when given with its ``sample_rate``."""
    import av
    import numpy as np

    height, width = frames[0].shape[:2]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        # one thread and no macroblock-tree rate control: x264 otherwise carries state that
        # makes small videos differ between runs
        video = container.add_stream("libx264", rate=fps,
                                     options={"threads": "1", "x264-params": "no-mbtree=1"})
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.time_base = Fraction(1, fps)
        audio = None
        layout = "mono"
        if sound is not None and sample_rate:
            layout = "stereo" if sound.shape[0] == 2 else "mono"
            audio = container.add_stream("aac", rate=sample_rate, layout=layout)
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        if audio is not None and sample_rate:
            samples = np.ascontiguousarray(np.clip(sound, -1.0, 1.0).astype(np.float32))
            size = audio.codec_context.frame_size or 1024
            for start in range(0, samples.shape[1], size):
                chunk = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[:, start:start + size]), format="fltp",
                    layout=layout)
                chunk.sample_rate, chunk.pts = sample_rate, start
                container.mux(audio.encode(chunk))
            container.mux(audio.encode())
    return buf.getvalue()
