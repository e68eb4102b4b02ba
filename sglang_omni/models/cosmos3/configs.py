"""The Cosmos3 pipelines: interleaved (UMM), direct generation, and text-only Reasoner."""

from __future__ import annotations

from sglang_omni.config.schema import PipelineConfig, register_pipeline
from sglang_omni.config.stages import generation_stage, orchestrator_stage, reasoner_stage


@register_pipeline
class Cosmos3UMMPipelineConfig(PipelineConfig):
    """Interleaved understanding and generation: generation on GPU 0, Reasoner on GPU 1."""

    mode = "umm"
    stage_specs = (orchestrator_stage(), generation_stage(0), reasoner_stage(1))


@register_pipeline
class Cosmos3PipelineConfig(PipelineConfig):
    """Direct generation: one generation stage on visible GPU 0."""

    mode = "generation"
    stage_specs = (generation_stage(0),)


@register_pipeline
class Cosmos3ReasonerPipelineConfig(PipelineConfig):
    """Text-only chat (``--text-only``): the Reasoner on visible GPU 0."""

    mode = "chat"
    stage_specs = (reasoner_stage(0),)
