"""Building a stage's engine: every backend by (backend, role), imported only when named.

The interface the engines implement (``Job``, ``Engine``, ``EngineSpec``) is the stage contract
in ``sglang_omni.contract.job``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sglang_omni.contract.job import Engine, EngineSpec

#: An engine class: built from the stage's spec.
EngineClass = Callable[[EngineSpec], Engine]


def _scripted_reasoner() -> EngineClass:
    from sglang_omni.engines.scripted import ScriptedReasoner
    return ScriptedReasoner


def _scripted_generator() -> EngineClass:
    from sglang_omni.engines.scripted import ScriptedGenerator
    return ScriptedGenerator


def _native_reasoner() -> EngineClass:
    from sglang_omni.engines.native.reasoner import NativeReasoner
    return NativeReasoner


def _native_generator() -> EngineClass:
    from sglang_omni.engines.native.generation import NativeGenerator
    return NativeGenerator


def _hf_reasoner() -> EngineClass:
    from sglang_omni.engines.hf import HFReasoner
    return HFReasoner


def _hf_generator() -> EngineClass:
    from sglang_omni.engines.hf import HFGenerator
    return HFGenerator


#: Every backend engine by (backend, role): a function that imports its class where it is
#: called, so only the engine a stage names is imported and heavy libraries load only for that
#: backend (the imports are literal: the import-graph test sees them).
ENGINES: dict[tuple[str, str], Callable[[], EngineClass]] = {
    ("scripted", "reasoner"): _scripted_reasoner,
    ("scripted", "generation"): _scripted_generator,
    ("native", "reasoner"): _native_reasoner,
    ("native", "generation"): _native_generator,
    ("hf", "reasoner"): _hf_reasoner,
    ("hf", "generation"): _hf_generator,
}


#: Backends that read the checkpoint from a folder on this machine (never a hub download).
LOCAL_CHECKPOINT_BACKENDS = ("hf",)


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
    if spec.backend in LOCAL_CHECKPOINT_BACKENDS:
        check_checkpoint_folder(spec)
    return target()(spec)


def check_checkpoint_folder(spec: EngineSpec) -> None:
    """RuntimeError naming ``model_path`` unless it is a folder: checked before the backend's
    libraries are imported, so a mistyped path fails in a moment with a message that says so
    (not after a torch import, as a hub repository name the hub libraries refuse)."""
    if not spec.model_path:
        raise RuntimeError(f"stages.{spec.stage}: the {spec.backend} backend needs model_path, "
                           "the checkpoint's folder (--model-path)")
    if Path(spec.model_path).is_dir():
        return
    raise RuntimeError(
        f"stages.{spec.stage}: the {spec.backend} backend reads its checkpoint from a folder, "
        f"and model_path {spec.model_path!r} is not one; pass --model-path (or model_path in "
        "the config file) the checkpoint's folder on this machine")
