"""``GET /v1/actions/metadata`` (and the first message of ``/v1/actions/realtime``): what the
Cosmos3 action route takes and returns, in native SGLang's shape (``cosmos3_action_metadata``).

The action modes follow the generation backend: native SGLang and the scripted engine serve
``policy`` and ``inverse_dynamics``; the ``hf`` backend serves them when the checkpoint's
transformer has action heads (``action_gen`` in ``transformer/config.json``), else none (its
400 says to use the native backend).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_omni.contract.actions import ACTION_MODES
from sglang_omni.contract.actions import DEFAULT_HORIZON as ACTION_HORIZON
from sglang_omni.contract.actions import MODEL_ACTION_DIM as PADDED_ACTION_DIM
from sglang_omni.contract.generation_options import ACTION_OPTION_DEFAULTS
from sglang_omni.contract.parallelism import PARALLEL_ARGS
from sglang_omni.models.cosmos3.generation_limits import ACTION_DEFAULTS

#: Native ``Cosmos3SamplingParams.supported_resolutions`` (width, height), in its order.
SUPPORTED_RESOLUTIONS = ((1280, 720), (720, 1280), (832, 480), (480, 832), (1024, 1024),
                         (640, 640))


def has_action_heads(model_path: str | None) -> bool:
    """Whether the checkpoint's generation transformer was trained with action heads."""
    try:
        config = json.loads((Path(str(model_path)) / "transformer" / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("action_gen")) if isinstance(config, dict) else False


def action_modes(backend: str, model_path: str | None) -> tuple[str, ...]:
    """The action modes a backend serves on this checkpoint."""
    if backend == "hf":
        return ACTION_MODES if has_action_heads(model_path) else ()
    return ACTION_MODES


def action_metadata(model: str, model_path: str | None, backend: str,
                    engine_args: dict[str, Any]) -> dict[str, Any]:
    """The metadata document of a server running ``backend`` with native ``engine_args``."""
    modes = list(action_modes(backend, model_path))
    parallel = {key: int(engine_args.get(key) or 1) for key in PARALLEL_ARGS}
    return {
        "object": "action.metadata", "model": model, "model_path": model_path,
        "policy_family": "cosmos3",
        "input": {"modalities": ["image", "video"],
                  "supported_resolutions": [list(r) for r in SUPPORTED_RESOLUTIONS],
                  "state_dim": None},
        "output": {"action_type": "continuous", "action_horizon": ACTION_HORIZON,
                   "action_dim": None, "padded_action_dim": PADDED_ACTION_DIM,
                   "dtype": "float32"},
        "runtime": {"parallelism": parallel},
        "defaults": {"action_mode": "policy", "action_horizon": ACTION_HORIZON,
                     "num_inference_steps": ACTION_OPTION_DEFAULTS["num_inference_steps"],
                     "height": ACTION_DEFAULTS.height, "width": ACTION_DEFAULTS.width,
                     "fps": ACTION_DEFAULTS.fps},
        "capabilities": {"action_modes": modes, "realtime_websocket": bool(modes),
                         "openpi_websocket": False, "batch_inputs": False, "max_batch_size": 1,
                         "batched_action_modes": ["policy"] if modes else []},
    }
