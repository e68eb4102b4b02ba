"""The library classes a checkpoint names, imported from their own modules.

``from diffusers import DiffusionPipeline`` and transformers' ``Auto*`` classes go through the
libraries' top-level lazy modules and model-zoo maps; the hf engines instead read the class name
the checkpoint records (``model_index.json``'s ``_class_name``, ``config.json``'s
``architectures``, ``processor_config.json``'s ``processor_class``) and import that class from
the module that defines it. A class this table does not know falls back to the libraries'
generic loaders (imported from their own submodules too), so another checkpoint still loads.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Class name -> the class, imported from the module that defines it (the Cosmos3 checkpoints'
#: classes); each import is a literal, done only when the checkpoint names that class.
Loader = Callable[[], Any]
PIPELINES: dict[str, Loader] = {
    "Cosmos3OmniPipeline": lambda: importlib.import_module(
        "diffusers.pipelines.cosmos.pipeline_cosmos3_omni").Cosmos3OmniPipeline,
}
MODELS: dict[str, Loader] = {
    "Cosmos3OmniForConditionalGeneration": lambda: importlib.import_module(
        "transformers.models.cosmos3_omni.modeling_cosmos3_omni"
    ).Cosmos3OmniForConditionalGeneration,
}
PROCESSORS: dict[str, Loader] = {
    "Qwen3VLProcessor": lambda: importlib.import_module(
        "transformers.models.qwen3_vl.processing_qwen3_vl").Qwen3VLProcessor,
}


#: Where a checkpoint names no class this module knows.
def generic_pipeline() -> Any:
    return importlib.import_module("diffusers.pipelines.pipeline_utils").DiffusionPipeline


def generic_model() -> Any:
    return importlib.import_module(
        "transformers.models.auto.modeling_auto").AutoModelForImageTextToText


def generic_processor() -> Any:
    return importlib.import_module("transformers.models.auto.processing_auto").AutoProcessor


def _read(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _load(name: str | None, known: dict[str, Loader], generic: Loader) -> Any:
    return known[name]() if name in known else generic()


def pipeline_class(model_path: str) -> Any:
    """The diffusers pipeline class of the checkpoint at ``model_path``."""
    name = _read(Path(model_path) / "model_index.json").get("_class_name")
    return _load(name, PIPELINES, generic_pipeline)


def model_class(model_path: str) -> Any:
    """The transformers model class of the checkpoint's understanding tower."""
    architectures = _read(Path(model_path) / "config.json").get("architectures") or [None]
    return _load(architectures[0], MODELS, generic_model)


def processor_class(model_path: str) -> Any:
    """The transformers processor class of the checkpoint."""
    root = Path(model_path)
    name = _read(root / "processor_config.json").get("processor_class") or \
        _read(root / "tokenizer_config.json").get("processor_class")
    return _load(name, PROCESSORS, generic_processor)
