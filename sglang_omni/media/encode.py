"""Encoders for generated media: PNG images and H.264 MP4 videos (optionally with AAC sound).

Both are reproducible: the same pixels (and sound) with the same ``VideoEncoding`` give the same
bytes on every run and every machine (x264 is deterministic for a fixed thread count; its thread
count is therefore a setting, never the machine's core count).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sglang_omni.errors import BadRequest

#: x264's preset names, fastest first (``x264 --help``); native SGLang's ``x264_preset``.
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                "slower", "veryslow", "placebo")
DEFAULT_X264_PRESET = "medium"
#: x264 threads where a server does not say (sized for a GPU host's cores).
DEFAULT_X264_THREADS = 8
#: The preset of the Reasoner's copy of a generated video (``engines.video_delivery``): made
#: before the client's MP4, so the next Reasoner turn does not wait for the slower encode.
READER_PRESET = "superfast"


@dataclass(frozen=True)
class VideoEncoding:
    """How H.264 is encoded: x264's ``preset`` and a fixed ``threads`` count (the bytes depend
    on both, and on nothing else of the machine)."""

    preset: str = DEFAULT_X264_PRESET
    threads: int = DEFAULT_X264_THREADS

    def slower_than(self, preset: str) -> bool:
        """Whether this encoding's preset is slower than ``preset`` (x264's order)."""
        return X264_PRESETS.index(self.preset) > X264_PRESETS.index(preset)

    def with_preset(self, preset: str | None) -> VideoEncoding:
        """This encoding with a request's ``x264_preset`` (None: unchanged)."""
        return self if preset is None else VideoEncoding(check_x264_preset(preset),
                                                         self.threads)


def check_x264_preset(value: Any, where: str = "x264_preset") -> str:
    """``value`` if it names an x264 preset; BadRequest naming ``where`` otherwise."""
    if not isinstance(value, str) or value not in X264_PRESETS:
        raise BadRequest(f"{where}: expected one of x264's presets ({', '.join(X264_PRESETS)}), "
                         f"got {value!r}"[:300])
    return value


def encode_png(pixels: Any) -> bytes:
    """An RGB uint8 array (height, width, 3) as PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def encode_mp4(frames: list[Any], fps: int, sound: Any = None,
               sample_rate: int | None = None,
               encoding: VideoEncoding = VideoEncoding()) -> bytes:
    """RGB uint8 frames as H.264 (yuv420p) in MP4, with the ``sound`` waveform (channels,
    samples) in [-1, 1] as an AAC track when given with its ``sample_rate``; x264 runs with
    ``encoding``'s preset and thread count."""
    import av
    import numpy as np

    height, width = frames[0].shape[:2]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        # a fixed thread count and no macroblock-tree rate control: x264 otherwise carries
        # state that makes small videos differ between runs
        video = container.add_stream("libx264", rate=fps, options={
            "threads": str(encoding.threads), "preset": encoding.preset,
            "x264-params": "no-mbtree=1"})
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
