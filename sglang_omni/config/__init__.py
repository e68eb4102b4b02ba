"""Pipeline configuration: declared stages, YAML files, dotted CLI overrides, validation."""

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
