"""``GET /server_info`` (every pipeline) and ``GET /model_info`` (direct generation), in the
shape native SGLang's diffusion server answers them (so a model gateway discovers an Omni server
as it discovers a native one).

Versions: ``version`` is the native SGLang release whose routes and shapes this server follows
(the pinned release; a gateway reads it as native's), whether or not native SGLang is installed;
``native_sglang`` says both apart (``follows``, and ``installed``: the sglang package found, or
null); ``omni_version`` is this package's. Omni adds ``pipeline``, ``mode``, ``engines`` (each
stage's backend; ``scripted`` true when a stage runs the scripted test engines, with its
``scripted_notice``) and ``random_weights`` with its ``notice``
(:mod:`sglang_omni.config.random_weights`: the checkpoint was built with random weights). The
playground shows both notices.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from sglang_omni.config.random_weights import RandomWeights
from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.serve.direct.context import DirectContext
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


def _installed_sglang() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def engines(config: ResolvedConfig) -> dict[str, str]:
    """Each model stage's backend (``native``, ``hf`` or ``scripted``), by stage name."""
    return {name: str(stage.factory["backend"]) for name, stage in config.stages.items()
            if "backend" in stage.factory}


def scripted_notice(backends: dict[str, str]) -> str | None:
    """The sentence the playground shows when a stage runs the scripted engines, else None."""
    scripted = [name for name, backend in backends.items() if backend == "scripted"]
    if not scripted:
        return None
    what = []
    if "reasoner" in scripted:
        what.append("the Reasoner follows an <omni-script> in the prompt (without one it "
                    "gives a canned reply)")
    if "generation" in scripted:
        what.append("images and videos are test patterns")
    return (f"scripted engines ({', '.join(scripted)}), no model: {' and '.join(what)} "
            "(docs/scripted-engines.md)")


def server_info(config: ResolvedConfig, mode: str, served_name: str,
                random: RandomWeights | None) -> dict[str, Any]:
    """The body of ``GET /server_info``; tp and dp are the generation stage's (the Reasoner's
    on the text-only server)."""
    stage = "generation" if "generation" in config.stages else "reasoner"
    engine = (config.stages[stage].engine if stage in config.stages else None) or {}
    backends = engines(config)
    notice = scripted_notice(backends)
    return {"model_path": config.model_path, "served_model_name": served_name,
            "tp_size": int(engine.get("tp_size") or 1), "dp_size": int(engine.get("dp_size") or 1),
            "version": NATIVE_VERSION,
            "native_sglang": {"follows": NATIVE_VERSION, "installed": _installed_sglang()},
            "omni_version": _omni_version(),
            "pipeline": config.config_cls, "mode": mode,
            "engines": backends, "scripted": notice is not None, "scripted_notice": notice,
            "random_weights": random is not None,
            "notice": random.notice_for(makes_media=mode != "chat") if random is not None
            else None}


def add_server_info_route(router: APIRouter, config: ResolvedConfig, mode: str,
                          served_name: str, random: RandomWeights | None) -> None:
    @router.get("/server_info")
    async def server_info_route() -> Response:
        """The served model and parallelism, as native's diffusion server reports them
        (`model_path`, `served_model_name`, `tp_size`, `dp_size`, `version`), and Omni's own
        fields.

        Versions: `version` is the native SGLang release whose routes and answer shapes this
        server follows (the pinned one, as a gateway that discovers native servers reads it),
        not what is installed; `native_sglang` has both, `{"follows": "0.5.23", "installed":
        "0.5.23"}` (`installed` is null where the sglang package is not installed: the hf and
        scripted backends need none); `omni_version` is this package's.

        Omni's: `pipeline` (the config class), `mode` (`umm`, `chat` or `generation`),
        `engines` (each stage's backend: `native`, `hf` or `scripted`), `scripted` (true when a
        stage runs the scripted test engines, said in `scripted_notice`), `random_weights`
        (the checkpoint was built with random weights, said in `notice`)."""
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
