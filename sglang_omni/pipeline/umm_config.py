"""``UMMPipelineConfig``: the config base of interleaved pipelines (their adapter, and the
output limits config loading checks against what their dispatches can produce)."""

from __future__ import annotations

import math
from typing import ClassVar, Protocol

from sglang_omni.config.model_protocols import DecisionRenderer
from sglang_omni.config.schema import PipelineConfig, ResolvedConfig
from sglang_omni.config.stages import MiB
from sglang_omni.errors import ConfigError
from sglang_omni.media.types import INLINE_LIMIT
from sglang_omni.pipeline.umm import UMMAdapter


class AdapterClass(DecisionRenderer, Protocol):
    """A UMM adapter class: called with no arguments, it makes one ``UMMAdapter`` per request;
    the class itself renders decisions for the engines (``DecisionRenderer``)."""

    def __call__(self) -> UMMAdapter: ...


class UMMPipelineConfig(PipelineConfig):
    """Base of interleaved pipelines: names the adapter and the inline/output limits.

    ``largest_output_bytes(max_dispatches)`` is what the configured number of dispatches can
    produce at most; config loading refuses a ``max_retained_bytes`` or ``max_outputs`` that
    cannot hold it.
    """

    mode = "umm"
    #: The adapter class: one instance per request; the class itself renders decisions for the
    #: engines.
    adapter_cls: ClassVar[AdapterClass]
    max_generations: ClassVar[int] = 8

    @classmethod
    def umm_adapter(cls) -> DecisionRenderer | None:
        return cls.adapter_cls

    @classmethod
    def generations_within(cls, max_dispatches: int) -> int:
        """The generations one request can run within ``max_dispatches`` stage dispatches:
        each takes a Reasoner turn to ask for it and a dispatch to run it, and a last turn
        answers (3 dispatches allow 1), at most ``max_generations``."""
        return min(cls.max_generations, max(0, (max_dispatches - 1) // 2))

    @classmethod
    def largest_output_bytes(cls, max_dispatches: int) -> int:
        """Subclasses say what their outputs can take; the base assumes every dispatch may
        output one media item at the 8 MiB inline limit, base64-encoded."""
        return max_dispatches * 4 * math.ceil(INLINE_LIMIT / 3)

    @classmethod
    def largest_output_count(cls, max_dispatches: int) -> int:
        return max_dispatches

    @classmethod
    def validate(cls, config: ResolvedConfig) -> None:
        factory = config.stage("orchestrator").factory
        dispatches = factory["max_dispatches"]
        need_bytes = cls.largest_output_bytes(dispatches)
        if factory["max_retained_bytes"] < need_bytes:
            raise ConfigError(
                f"stages.orchestrator.factory.max_retained_bytes: {factory['max_retained_bytes']} "
                f"cannot hold the largest output of max_dispatches={dispatches} "
                f"({need_bytes / MiB:.1f} MiB); set it to at least {need_bytes}"
            )
        need_outputs = cls.largest_output_count(dispatches)
        if factory["max_outputs"] < need_outputs:
            raise ConfigError(
                f"stages.orchestrator.factory.max_outputs: {factory['max_outputs']} cannot hold "
                f"the outputs of max_dispatches={dispatches}; set it to at least {need_outputs}"
            )
