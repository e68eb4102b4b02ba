"""NVIDIA Cosmos3 Nano: the interleaving adapter and the pipeline config classes."""

from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter
from sglang_omni.models.cosmos3.configs import (
    Cosmos3PipelineConfig,
    Cosmos3ReasonerPipelineConfig,
    Cosmos3UMMPipelineConfig,
)

__all__ = [
    "Cosmos3PipelineConfig",
    "Cosmos3ReasonerPipelineConfig",
    "Cosmos3UMMAdapter",
    "Cosmos3UMMPipelineConfig",
]
