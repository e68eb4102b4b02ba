"""The hf engines import the classes a checkpoint names from the modules that define them, and
fall back to the libraries' generic loaders for a class they do not know."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from sglang_omni.engines.hf.classes import (  # noqa: E402
    model_class,
    pipeline_class,
    processor_class,
)


def test_the_tiny_checkpoints_classes_come_from_their_own_modules(tiny_checkpoint: Path) -> None:
    path = str(tiny_checkpoint)
    assert pipeline_class(path).__module__ == "diffusers.pipelines.cosmos.pipeline_cosmos3_omni"
    assert model_class(path).__name__ == "Cosmos3OmniForConditionalGeneration"
    assert processor_class(path).__name__ == "Qwen3VLProcessor"


def test_an_unknown_class_loads_through_the_generic_loaders(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "OtherPipeline"}))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["OtherModel"]}))
    assert pipeline_class(str(tmp_path)).__name__ == "DiffusionPipeline"
    assert model_class(str(tmp_path)).__name__ == "AutoModelForImageTextToText"
    assert processor_class(str(tmp_path)).__name__ == "AutoProcessor"  # none named
