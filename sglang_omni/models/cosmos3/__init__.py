"""NVIDIA Cosmos3 Nano: pipeline config classes (and the interleaving adapter)."""

from sglang_omni.models.cosmos3.configs import (
    Cosmos3PipelineConfig,
    Cosmos3ReasonerPipelineConfig,
    Cosmos3UMMPipelineConfig,
)

__all__ = [
    "Cosmos3PipelineConfig",
    "Cosmos3ReasonerPipelineConfig",
    "Cosmos3UMMPipelineConfig",
]
