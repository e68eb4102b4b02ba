"""Cosmos3's generation defaults and size multiples, applied by the server's generation limits
(``contract.generation_limits``, through :class:`~sglang_omni.models.cosmos3.model.Cosmos3Model`).
"""

from __future__ import annotations

from sglang_omni.contract.actions import DEFAULT_HORIZON
from sglang_omni.contract.generation_limits import Defaults
from sglang_omni.contract.generation_options import (
    ACTION_OPTION_DEFAULTS,
    DEFAULT_FPS,
    DEFAULT_VIDEO_FRAMES,
    HF_SIZE_MULTIPLE,
)

#: Native Cosmos3 (``Cosmos3SamplingParams``): 1280x720 at 24 fps; videos of the interleaved
#: pipeline default to 33 frames.
NATIVE_DEFAULTS = Defaults(1280, 720, DEFAULT_VIDEO_FRAMES, DEFAULT_FPS)
#: The native Cosmos3 action route: its defaults' size and rate, ``action_horizon`` + 1 frames.
ACTION_DEFAULTS = Defaults(ACTION_OPTION_DEFAULTS["width"], ACTION_OPTION_DEFAULTS["height"],
                           DEFAULT_HORIZON + 1, ACTION_OPTION_DEFAULTS["fps"])
#: Width and height multiples the generation backends need (the diffusers Cosmos3 pipeline of
#: the ``hf`` backend: the VAE's spatial scale factor).
SIZE_MULTIPLE_BY_BACKEND = {"hf": HF_SIZE_MULTIPLE}
