"""Cosmos3's generation defaults and size multiples, applied by the server's generation limits
(``contract.generation_limits``, through :class:`~sglang_omni.models.cosmos3.model.Cosmos3Model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_omni.config.server import ServerSettings
from sglang_omni.contract import generation_limits
from sglang_omni.contract.generation_limits import Defaults
from sglang_omni.contract.generation_options import (
    DEFAULT_FPS,
    DEFAULT_SIZE,
    DEFAULT_VIDEO_FRAMES,
)

#: Native Cosmos3 (``Cosmos3SamplingParams``): 1280x720 at 24 fps; videos of the interleaved
#: pipeline default to 33 frames.
NATIVE_DEFAULTS = Defaults(1280, 720, DEFAULT_VIDEO_FRAMES, DEFAULT_FPS)
#: The native Cosmos3 action route: 832x480 at 5 fps, ``action_horizon`` 16 (17 frames).
ACTION_DEFAULTS = Defaults(832, 480, 17, 5)
#: Width and height multiples the generation backends need (the diffusers Cosmos3 pipeline of
#: the ``hf`` backend: the VAE's spatial scale factor, ``engines/hf/generation.SIZE_MULTIPLE``).
SIZE_MULTIPLE_BY_BACKEND = {"hf": 16}


def default_size(backend: Any) -> tuple[int, int]:
    """The width and height a generation on ``backend`` makes when a request leaves them out:
    the hf and scripted engines' square ``DEFAULT_SIZE``, native Cosmos3's 1280x720."""
    if str(backend) in ("hf", "scripted"):
        return DEFAULT_SIZE, DEFAULT_SIZE
    return NATIVE_DEFAULTS.width, NATIVE_DEFAULTS.height


def size_multiple(backend: Any) -> int:
    """The width/height multiple the generation stage's backend needs (1: none known)."""
    return SIZE_MULTIPLE_BY_BACKEND.get(str(backend), 1)


def check_generation_limits(options: Mapping[str, Any], settings: ServerSettings, *,
                            where: str = "", video: bool = True,
                            defaults: Defaults = NATIVE_DEFAULTS, multiple: int = 1,
                            feeds_reasoner: bool = False) -> None:
    """The server's limits with Cosmos3's defaults (``contract.generation_limits``)."""
    generation_limits.check_generation_limits(
        options, settings, where=where, video=video, defaults=defaults, multiple=multiple,
        feeds_reasoner=feeds_reasoner)
