"""Pipeline configuration: declared stages, YAML files, dotted CLI overrides, validation; the
model packages a config serves (``model_imports``: entry points and ``model_packages``) and the
note of a random-weight checkpoint at ``model_path`` (``random_weights``)."""

from sglang_omni.config.loader import load_config, parse_overrides
from sglang_omni.config.schema import (
    FactoryField,
    PipelineConfig,
    ResolvedConfig,
    StageConfig,
    StageSpec,
    pipeline_class,
    register_pipeline,
)

__all__ = [
    "FactoryField",
    "PipelineConfig",
    "ResolvedConfig",
    "StageConfig",
    "StageSpec",
    "load_config",
    "parse_overrides",
    "pipeline_class",
    "register_pipeline",
]
