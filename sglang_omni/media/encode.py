"""Encoders for generated media: PNG images and H.264 MP4 videos (optionally with AAC sound).

Both are reproducible: the same pixels (and sound) with the same ``VideoEncoding`` give the same
bytes on every run and every machine (x264 is deterministic for a fixed thread count; its thread
count is therefore a setting, never the machine's core count).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
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
#: x264's tunes a server may set (``none``: x264's own defaults). ``zerolatency`` encodes each
#: frame as it is handed in (no frame lookahead, no B-frames, threads per slice), so an MP4 fed
#: while the VAE decodes is done when its last frame is (issue 34: 0.0 s after the last frame for
#: presets ultrafast to medium on 8 or 16 threads, 1280x720 33 frames over 2 s, on the H200
#: host), for somewhat larger files (242 KB against 200 KB for smooth frames at medium).
X264_TUNES = ("none", "zerolatency", "film", "animation", "grain", "stillimage", "fastdecode")
DEFAULT_X264_TUNE = "zerolatency"


@dataclass(frozen=True)
class VideoEncoding:
    """How H.264 is encoded: x264's ``preset``, a fixed ``threads`` count and its ``tune``
    (``none``: none); the bytes depend on these, and on nothing else of the machine."""

    preset: str = DEFAULT_X264_PRESET
    threads: int = DEFAULT_X264_THREADS
    tune: str = DEFAULT_X264_TUNE

    def with_preset(self, preset: str | None) -> VideoEncoding:
        """This encoding with a request's ``x264_preset`` (None: unchanged)."""
        return self if preset is None else VideoEncoding(check_x264_preset(preset),
                                                         self.threads, self.tune)

    def x264_options(self) -> dict[str, str]:
        """The libx264 options for this encoding."""
        # a fixed thread count and no macroblock-tree rate control: x264 otherwise carries
        # state that makes small videos differ between runs
        options = {"threads": str(self.threads), "preset": self.preset,
                   "x264-params": "no-mbtree=1"}
        if self.tune != "none":
            options["tune"] = self.tune
        return options


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


#: ``progress()``: called by an encoder after each frame it takes in and each packet it writes
#: (from the encoding thread), so a caller can tell a long encode from a hung one.
Progress = Callable[[], None]


def _no_progress() -> None:
    return None


class Mp4Encoder:
    """One H.264 (yuv420p) MP4 being encoded frame by frame, in memory.

    ``add(pixels)`` takes each RGB uint8 frame (height, width, 3) in order, as soon as it
    exists (a caller may feed frames while it still makes the later ones); ``finish(sound)``
    flushes x264, adds the ``sound`` waveform (channels, samples) in [-1, 1] as an AAC track
    when the encoder was opened with a ``sample_rate``, and returns the MP4's bytes. ``close()``
    drops an unfinished encode (a ``with`` block closes it). ``progress`` is called after every
    frame taken in and every packet written, flush included (x264 holds up to its lookahead of
    frames and encodes them in the flush: at slow presets most of the time is there). Use from
    one thread at a time; every call blocks while x264 works.
    """

    def __init__(self, width: int, height: int, fps: int,
                 encoding: VideoEncoding = VideoEncoding(), *, sample_rate: int | None = None,
                 sound_channels: int = 1, progress: Progress = _no_progress) -> None:
        import av

        self.width, self.height, self.fps = width, height, fps
        self.sample_rate = sample_rate
        self.progress = progress
        self.frames = 0
        self._buf = io.BytesIO()
        self._container: Any = av.open(self._buf, "w", format="mp4")
        self._video = self._container.add_stream("libx264", rate=fps,
                                                 options=encoding.x264_options())
        self._video.width, self._video.height, self._video.pix_fmt = width, height, "yuv420p"
        self._video.codec_context.time_base = Fraction(1, fps)
        self._layout = "stereo" if sound_channels == 2 else "mono"
        self._audio = self._container.add_stream("aac", rate=sample_rate, layout=self._layout) \
            if sample_rate else None

    def __enter__(self) -> Mp4Encoder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add(self, pixels: Any) -> None:
        """Encode the next frame: an RGB uint8 array of the encoder's height and width."""
        import av

        if tuple(pixels.shape[:2]) != (self.height, self.width):
            raise ValueError(f"frame {self.frames} is {pixels.shape[1]}x{pixels.shape[0]}, "
                             f"the video {self.width}x{self.height}")
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts, frame.time_base = self.frames, Fraction(1, self.fps)
        self.frames += 1
        for packet in self._video.encode(frame):
            self._container.mux(packet)
        self.progress()

    def finish(self, sound: Any = None) -> bytes:
        """Flush the video (reporting each packet), add ``sound`` where the encoder has an
        audio track, close the container; the MP4's bytes."""
        import av
        import numpy as np

        for packet in self._video.encode_lazy(None):
            self._container.mux(packet)
            self.progress()
        audio, rate = self._audio, self.sample_rate
        if audio is not None and rate and sound is not None:
            samples = np.ascontiguousarray(np.clip(sound, -1.0, 1.0).astype(np.float32))
            size = audio.codec_context.frame_size or 1024
            for start in range(0, samples.shape[1], size):
                chunk = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[:, start:start + size]), format="fltp",
                    layout=self._layout)
                chunk.sample_rate, chunk.pts = rate, start
                self._container.mux(audio.encode(chunk))
            self._container.mux(audio.encode())
        self._container.close()
        self.progress()
        return self._buf.getvalue()

    def close(self) -> None:
        """Free the encoder (after ``finish``, or instead of it: the encode is dropped)."""
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - an unfinished encode has nothing to keep
                pass
            self._container = None


def encode_mp4(frames: Sequence[Any], fps: int, sound: Any = None,
               sample_rate: int | None = None,
               encoding: VideoEncoding = VideoEncoding(),
               progress: Progress = _no_progress) -> bytes:
    """RGB uint8 frames as H.264 (yuv420p) in MP4, with the ``sound`` waveform (channels,
    samples) in [-1, 1] as an AAC track when given with its ``sample_rate``; x264 runs with
    ``encoding``'s preset and thread count; ``progress`` as :class:`Mp4Encoder` calls it."""
    height, width = frames[0].shape[:2]
    with_sound = sound is not None and bool(sample_rate)
    with Mp4Encoder(width, height, fps, encoding,
                    sample_rate=sample_rate if with_sound else None,
                    sound_channels=sound.shape[0] if with_sound else 1,
                    progress=progress) as encoder:
        for pixels in frames:
            encoder.add(pixels)
        return encoder.finish(sound if with_sound else None)
