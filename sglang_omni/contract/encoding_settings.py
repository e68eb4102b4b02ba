"""The generation stage's video encoding settings: the factory options that name x264's
preset, thread count and tune, and the ``VideoEncoding`` an engine reads from them."""

from __future__ import annotations

from typing import Any

from sglang_omni.config.schema import FactoryField
from sglang_omni.media.encode import (
    DEFAULT_X264_PRESET,
    DEFAULT_X264_THREADS,
    DEFAULT_X264_TUNE,
    X264_PRESETS,
    X264_TUNES,
    VideoEncoding,
)

ENCODING_FACTORY: dict[str, FactoryField] = {
    "x264_threads": FactoryField(
        (int,), DEFAULT_X264_THREADS, "hf and scripted backends: x264 threads per MP4 encode, "
        "fixed so that the same setting gives the same bytes on every machine (size it to the "
        "host's cores: 8 for a GPU host)", minimum=1),
    "x264_preset": FactoryField(
        (str,), DEFAULT_X264_PRESET, "hf and scripted backends: x264's preset for MP4s where a "
        "request names no x264_preset (faster presets: larger files; native SGLang uses its "
        "own unless the request names one)", choices=X264_PRESETS),
    "x264_tune": FactoryField(
        (str,), DEFAULT_X264_TUNE, "hf and scripted backends: x264's tune for every MP4 "
        "(none: x264's defaults); zerolatency encodes each frame as the VAE decodes it, so the "
        "MP4 is done when its last frame is, for somewhat larger files", choices=X264_TUNES),
}


def video_encoding(factory: dict[str, Any]) -> VideoEncoding:
    """The encoding a generation stage's ``factory`` names (the defaults where unset)."""
    return VideoEncoding(str(factory.get("x264_preset") or DEFAULT_X264_PRESET),
                         int(factory.get("x264_threads") or DEFAULT_X264_THREADS),
                         str(factory.get("x264_tune") or DEFAULT_X264_TUNE))
