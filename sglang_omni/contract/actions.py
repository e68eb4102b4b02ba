"""The native Cosmos3 action route as an engine sees it: where its fields are read from, the
checks native applies before a generation, and the response envelope (``object:
"action.generation"``). One home for every backend that answers actions (scripted, hf); the
native backend hands the body to SGLang itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sglang_omni.errors import BadRequest

#: The native action route's defaults (``build_cosmos3_action_sampling_params``).
DEFAULT_HORIZON = 16
ACTION_MODES = ("policy", "inverse_dynamics")
#: The Cosmos3 transformer's action width (``Cosmos3VideoArchConfig.action_dim``): an action is
#: padded to it and sliced to ``raw_action_dim``, which native keeps within ``[1, 64]``.
MODEL_ACTION_DIM = 64


#: What the native route takes from ``input`` beside its ``observation`` (``task`` and
#: ``prompt`` become the prompt).
INPUT_KEYS = ("images", "state", "noise", "image", "image_path", "input_reference", "video",
              "video_path")


def action_fields(request: dict[str, Any]) -> dict[str, Any]:
    """The fields the native Cosmos3 action route reads, flattened as it reads them: without
    ``input``, the body; with it, ``input.observation`` and, from ``input``, the prompt
    (``task``, else ``prompt``) and :data:`INPUT_KEYS` (the rest of the body and of ``input``
    is not read); then ``parameters``, which win (but for the prompt: native reads it from the
    observation alone). Every check of an action request and every backend reads this one
    mapping."""
    if "input" not in request:
        fields = {k: v for k, v in request.items() if k not in ("parameters", "runtime")}
    else:
        given = request.get("input") or {}
        given = given if isinstance(given, dict) else {}
        observation = given.get("observation")
        fields = dict(observation) if isinstance(observation, dict) else {}
        if "task" in given:
            fields["prompt"] = given["task"]
        elif "prompt" in given:
            fields["prompt"] = given["prompt"]
        fields.update({k: given[k] for k in INPUT_KEYS if k in given})
    if isinstance(request.get("parameters"), dict):  # the prompt is the observation's
        fields.update({k: v for k, v in request["parameters"].items()
                       if k not in ("prompt", "task")})
    return fields


def action_prompt(fields: dict[str, Any]) -> str:
    """The prompt of :func:`action_fields`: ``prompt``, else ``task`` (as native reads it)."""
    prompt = fields.get("prompt")
    return str(fields.get("task") or "") if prompt is None else str(prompt)


@dataclass(frozen=True)
class ActionPlan:
    """What an action request asks for, after native's checks."""

    mode: str
    horizon: int
    domain_name: str | None
    domain_id: int | None
    raw_action_dim: int | None


def _horizon(given: Any, num_frames: Any) -> int:
    """The action horizon, as native derives it: ``action_horizon`` (16 when neither is
    given), else ``num_frames`` - 1; both given must agree (frames = horizon + 1), and the
    frames less one must be a multiple of 4 (the temporal VAE)."""
    if given is None and num_frames is None:
        given = DEFAULT_HORIZON
    if given is not None:
        horizon = int(given)
        if horizon <= 0:
            raise BadRequest("action_horizon must be a positive integer")
        if num_frames is not None and int(num_frames) != horizon + 1:
            raise BadRequest(f"Cosmos3 requires num_frames == action_horizon + 1, got "
                             f"num_frames={int(num_frames)}, action_horizon={horizon}"[:300])
    else:
        if int(num_frames) <= 1:
            raise BadRequest("Cosmos3 action num_frames must be greater than 1")
        horizon = int(num_frames) - 1
    if horizon % 4:
        raise BadRequest("Cosmos3 action_horizon must be divisible by 4 so num_frames is "
                         "compatible with the temporal VAE")
    return horizon


def plan_action(fields: dict[str, Any]) -> ActionPlan:
    """Native's checks of an action request (400 with native's message otherwise)."""
    mode = str(fields.get("action_mode", "policy")).strip().lower()
    if mode == "forward_dynamics":
        raise BadRequest("Cosmos3 forward_dynamics produces video; use /v1/videos instead")
    if mode not in ACTION_MODES:
        raise BadRequest("Cosmos3 action endpoint supports action_mode='policy' or "
                         "'inverse_dynamics'")
    horizon = _horizon(fields.get("action_horizon"), fields.get("num_frames"))
    domain_name, domain_id = fields.get("domain_name"), fields.get("domain_id")
    raw_dim = fields.get("raw_action_dim")
    if domain_id is None and not domain_name:
        raise BadRequest("Cosmos3 action requests require domain_name or domain_id")
    if domain_id is not None and not domain_name and raw_dim is None:
        raise BadRequest("raw_action_dim is required when only domain_id is provided")
    if raw_dim is not None and not 0 < int(raw_dim) <= MODEL_ACTION_DIM:
        raise BadRequest(f"raw_action_dim must be in [1, {MODEL_ACTION_DIM}], got "
                         f"{int(raw_dim)}"[:200])
    return ActionPlan(mode, horizon, str(domain_name) if domain_name else None,
                      None if domain_id is None else int(domain_id),
                      None if raw_dim is None else int(raw_dim))


def action_envelope(rid: str, values: list[list[float]], *, mode: str, domain_id: int,
                    raw_action_dim: int, steps: int, model: str = "") -> dict[str, Any]:
    """One action answer: ``values`` are ``[horizon, raw_action_dim]`` rows."""
    horizon = len(values)
    action = {"type": "continuous", "dtype": "float32", "shape": [horizon, raw_action_dim],
              "values": values, "action_mode": mode, "domain_id": int(domain_id),
              "raw_action_dim": raw_action_dim}
    return {"id": rid, "object": "action.generation", "created": int(time.time()),
            "model": model,
            "data": [{"index": 0, "input_index": 0, "candidate_index": 0, "action": action}],
            "usage": {"batch_size": 1, "action_horizon": horizon, "action_dim": raw_action_dim,
                      "denoise_steps": steps, "prefix_cache_hit": False}}
