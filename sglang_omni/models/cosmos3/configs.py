"""The Cosmos3 pipelines: interleaved (UMM), direct generation, and text-only Reasoner; each
serves :data:`~sglang_omni.models.cosmos3.model.COSMOS3` and registers itself as a
``config_cls`` when imported (``config.schema.register_pipeline``)."""

from __future__ import annotations

import math

from sglang_omni.config.schema import PipelineConfig, register_pipeline
from sglang_omni.config.stages import generation_stage, orchestrator_stage, reasoner_stage
from sglang_omni.contract.encoding_settings import ENCODING_FACTORY
from sglang_omni.media.types import INLINE_LIMIT
from sglang_omni.models.cosmos3.adapter import Cosmos3UMMAdapter
from sglang_omni.models.cosmos3.decision import MAX_ANSWER_CHARS, MAX_PROMPT_CHARS
from sglang_omni.models.cosmos3.model import COSMOS3
from sglang_omni.pipeline.umm_config import UMMPipelineConfig

UTF8_MAX = 4  # bytes per character at worst


@register_pipeline
class Cosmos3UMMPipelineConfig(UMMPipelineConfig):
    """Interleaved understanding and generation: generation on GPU 0, Reasoner on GPU 1."""

    stage_specs = (orchestrator_stage(), generation_stage(0, ENCODING_FACTORY),
                   reasoner_stage(1))
    adapter_cls = Cosmos3UMMAdapter
    model = COSMOS3
    max_generations = 8

    @classmethod
    def largest_output_bytes(cls, max_dispatches: int) -> int:
        """Generations at the inline limit as base64 data URLs, a prompt per generation and an
        answer per other turn at the character limits in worst-case UTF-8 (about 86 MiB for
        17 dispatches)."""
        generations = cls.generations_within(max_dispatches)
        media = generations * 4 * math.ceil(INLINE_LIMIT / 3)
        text = (generations * MAX_PROMPT_CHARS
                + (max_dispatches - generations) * MAX_ANSWER_CHARS) * UTF8_MAX
        return media + text


@register_pipeline
class Cosmos3PipelineConfig(PipelineConfig):
    """Direct generation: one generation stage on visible GPU 0."""

    mode = "generation"
    stage_specs = (generation_stage(0, ENCODING_FACTORY),)
    model = COSMOS3


@register_pipeline
class Cosmos3ReasonerPipelineConfig(PipelineConfig):
    """Text-only chat (``--text-only``): the Reasoner on visible GPU 0."""

    mode = "chat"
    stage_specs = (reasoner_stage(0),)
    model = COSMOS3
    text_only = True
