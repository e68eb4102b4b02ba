"""Building a stage's engine: every backend by (backend, role), imported only when named.

The interface the engines implement (``Job``, ``Engine``, ``EngineSpec``) is the stage contract
in ``sglang_omni.contract.job``.
"""

from __future__ import annotations

import importlib

from sglang_omni.contract.job import Engine, EngineSpec

#: Every backend engine by (backend, role), as an import string "module:Class"; only the one
#: a stage names is imported, so heavy libraries load only for that backend.
ENGINES: dict[tuple[str, str], str] = {
    ("scripted", "reasoner"): "sglang_omni.engines.scripted:ScriptedReasoner",
    ("scripted", "generation"): "sglang_omni.engines.scripted:ScriptedGenerator",
    ("native", "reasoner"): "sglang_omni.engines.native.reasoner:NativeReasoner",
    ("native", "generation"): "sglang_omni.engines.native.generation:NativeGenerator",
    ("hf", "reasoner"): "sglang_omni.engines.hf:HFReasoner",
    ("hf", "generation"): "sglang_omni.engines.hf:HFGenerator",
}


def build_engine(spec: EngineSpec) -> Engine:
    """Construct the backend ``spec`` names (see ``ENGINES``); RuntimeError naming the field
    when no engine serves that backend and role."""
    target = ENGINES.get((spec.backend, spec.role))
    if target is None:
        if any(backend == spec.backend for backend, _ in ENGINES):
            raise RuntimeError(f"stages.{spec.stage}: the {spec.backend} backend has no engine "
                               f"for role {spec.role!r}; use a reasoner or generation stage")
        known = ", ".join(sorted({backend for backend, _ in ENGINES}))
        raise RuntimeError(
            f"stages.{spec.stage}.factory.backend: {spec.backend!r} is not a backend; use one "
            f"of {known}"
        )
    module_name, _, class_name = target.partition(":")
    engine_cls = getattr(importlib.import_module(module_name), class_name)
    return engine_cls(spec)
