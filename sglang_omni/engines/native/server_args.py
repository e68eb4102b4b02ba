"""The native SGLang server arguments a Reasoner stage starts its engine with.

Native SGLang derives the context length from the checkpoint and the memory fraction from the
GPU, as ``sglang serve`` does. On top of that, in increasing precedence:

* ``stages.<stage>.gpu_memory_fraction`` (the placement budget) becomes ``mem_fraction_static``;
* ``stages.<stage>.engine`` holds any native server argument, passed through unchanged
  (``--mem-fraction-static`` writes ``engine.mem_fraction_static``). An explicit memory
  fraction there wins over the placement budget, with a warning.

``model_path`` comes from the top-level ``model_path``. The stage returns one text completion per
request, so the native tool-call and reasoning parsers are refused. No sglang import here: the
scripted Reasoner resolves the same arguments, so these rules are testable without the extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_omni.contract.job import EngineSpec
from sglang_omni.media.policy import NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB

MEMORY_FRACTION = "mem_fraction_static"
#: The prompt of ``sglang serve``'s text warmup (``http_server._execute_server_warmup``,
#: 0.5.23), sent before a Reasoner stage reports ready unless ``skip_server_warmup`` is set.
WARMUP_PROMPT = "The capital city of France is"
REFUSED = {
    "model_path": "set model_path (--model-path) instead",
    "tool_call_parser": "the stage returns one text completion and serves no native tool "
                        "calls; run sglang serve on the same checkpoint for them",
    "reasoning_parser": "the stage returns one text completion without a reasoning parser; "
                        "run sglang serve on the same checkpoint for one",
}


class ServerArgsError(ValueError):
    """An engine argument the stage cannot run with; the message names the key and the fix."""


@dataclass(frozen=True)
class NativeServerArgs:
    """``kwargs`` for ``sglang.Engine``, the warnings to log, and the Omni-read settings."""

    kwargs: dict[str, Any]
    warnings: tuple[str, ...]

    @property
    def skip_warmup(self) -> bool:
        return bool(self.kwargs.get("skip_server_warmup"))

    @property
    def media_url_max_file_size_mb(self) -> float:
        value = self.kwargs.get("media_url_max_file_size_mb")
        return NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB if value is None else float(value)


def resolve_server_args(spec: EngineSpec) -> NativeServerArgs:
    """Merge placement and ``engine`` into native server arguments; ServerArgsError if refused."""
    prefix = f"stages.{spec.stage}"
    for key, why in REFUSED.items():
        if spec.engine.get(key) is not None:
            raise ServerArgsError(f"{prefix}.engine.{key}: {why}")
    kwargs = dict(spec.engine)
    kwargs["model_path"] = spec.model_path
    warnings = []
    budget = spec.gpu_memory_fraction
    explicit = kwargs.get(MEMORY_FRACTION)
    if budget is not None and explicit is not None:
        warnings.append(
            f"{prefix}.engine.{MEMORY_FRACTION} {explicit} (or --mem-fraction-static) wins over "
            f"the placement budget {prefix}.gpu_memory_fraction {budget}; native SGLang uses "
            f"{explicit}")
    elif budget is not None:
        kwargs[MEMORY_FRACTION] = budget
    size = kwargs.get("media_url_max_file_size_mb")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int | float)
                             or size < 0):
        raise ServerArgsError(f"{prefix}.engine.media_url_max_file_size_mb: expected a number "
                              f">= 0 (0 disables the limit), got {size!r}")
    return NativeServerArgs(kwargs, tuple(warnings))
