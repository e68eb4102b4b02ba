"""The toy model's pipelines, registered as ``config_cls`` names when this module is imported."""

from __future__ import annotations

import math

from sglang_omni.config.schema import PipelineConfig, register_pipeline
from sglang_omni.config.stages import generation_stage, orchestrator_stage, reasoner_stage
from sglang_omni.contract.encoding_settings import ENCODING_FACTORY
from sglang_omni.media.types import INLINE_LIMIT
from sglang_omni.pipeline.umm_config import UMMPipelineConfig
from tests.toy_model.adapter import ToyUMMAdapter
from tests.toy_model.model import TOY


@register_pipeline
class ToyUMMPipelineConfig(UMMPipelineConfig):
    """The toy's interleaved pipeline: at most two generations a request."""

    stage_specs = (orchestrator_stage(), generation_stage(0, ENCODING_FACTORY),
                   reasoner_stage(1))
    adapter_cls = ToyUMMAdapter
    model = TOY
    max_generations = 2

    @classmethod
    def largest_output_bytes(cls, max_dispatches: int) -> int:
        return cls.max_generations * 4 * math.ceil(INLINE_LIMIT / 3) + 1_000_000


@register_pipeline
class ToyPipelineConfig(PipelineConfig):
    """The toy's direct generation: one generation stage."""

    mode = "generation"
    stage_specs = (generation_stage(0, ENCODING_FACTORY),)
    model = TOY
