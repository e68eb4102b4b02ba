"""``GET /server_info`` (every pipeline) and ``GET /model_info`` (direct generation), in the
shape native SGLang's diffusion server answers them (so a model gateway discovers an Omni server
as it discovers a native one).

``version`` is the SGLang release Omni serves natively (the gateway reads it as native's);
``omni_version`` is this package's. Omni adds ``pipeline``, ``mode`` and ``random_weights`` with
its ``notice`` (:mod:`sglang_omni.contract.random_weights`: the checkpoint was built with random
weights; the playground shows the notice).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.contract.random_weights import RandomWeights
from sglang_omni.serve.direct.direct_context import DirectContext
from sglang_omni.serve.wire.responses import json_response

#: The pinned native release (``pyproject.toml``'s ``native`` extra).
NATIVE_VERSION = "0.5.23"
#: Native's name for the Cosmos3 generation pipeline class and its task type (text and image
#: to video).
PIPELINE_CLASS = "Cosmos3Pipeline"
TASK_TYPE = "TI2V"


def _omni_version() -> str:
    try:
        return version("sglang-omni")
    except PackageNotFoundError:
        return "unknown"


def server_info(config: ResolvedConfig, mode: str, served_name: str,
                random: RandomWeights | None) -> dict[str, Any]:
    """The body of ``GET /server_info``; tp and dp are the generation stage's (the Reasoner's
    on the text-only server)."""
    stage = "generation" if "generation" in config.stages else "reasoner"
    engine = (config.stages[stage].engine if stage in config.stages else None) or {}
    return {"model_path": config.model_path, "served_model_name": served_name,
            "tp_size": int(engine.get("tp_size") or 1), "dp_size": int(engine.get("dp_size") or 1),
            "version": NATIVE_VERSION, "omni_version": _omni_version(),
            "pipeline": config.config_cls, "mode": mode,
            "random_weights": random is not None,
            "notice": random.notice if random is not None else None}


def add_server_info_route(router: APIRouter, config: ResolvedConfig, mode: str,
                          served_name: str, random: RandomWeights | None) -> None:
    @router.get("/server_info")
    async def server_info_route() -> Response:
        """The served model and parallelism, as native's diffusion server reports them, and
        whether the checkpoint's weights are random (`random_weights`, with a `notice`)."""
        return json_response(server_info(config, mode, served_name, random))


def model_info(ctx: DirectContext) -> dict[str, Any]:
    return {"model_path": ctx.orchestrator.config.model_path, "is_generation": True,
            "model_type": "diffusion", "architectures": [PIPELINE_CLASS],
            "has_image_understanding": True, "has_audio_understanding": False,
            "task_type": TASK_TYPE, "is_image_gen": False}


def add_info_routes(router: APIRouter, ctx: DirectContext) -> None:
    @router.get("/model_info")
    async def model_info_route() -> Response:
        """The model's capabilities, as native's diffusion server reports them."""
        return json_response(model_info(ctx))
