"""What a pipeline config class declares, and the resolved, validated configuration.

A pipeline config class (a ``PipelineConfig`` subclass) declares its stages as ``StageSpec``s.
Files and flags may change a declared stage's fields; they can never add or remove a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from sglang_omni.config.model_imports import (
    import_model_package,
    load_entry_point,
    model_entry_points,
)
from sglang_omni.config.model_protocols import DecisionRenderer, ModelProtocol
from sglang_omni.config.server import ServerSettings
from sglang_omni.errors import ConfigError

BACKENDS = ("native", "hf", "scripted")
CPU_BACKENDS = ("hf", "scripted")


@dataclass(frozen=True)
class FactoryField:
    """One ``factory`` option of a stage: its accepted types, default and an optional check."""

    types: tuple[type, ...]
    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None


def _backend_field() -> FactoryField:
    return FactoryField((str,), "native", "engine backend", choices=BACKENDS)


# Factory options every process stage has.
PROCESS_FACTORY: dict[str, FactoryField] = {
    "backend": _backend_field(),
    "startup_timeout_s": FactoryField(
        (int, float), 900.0, "seconds to wait for the stage's ready handshake", minimum=0.001
    ),
    "start_delay_s": FactoryField(
        (int, float), 0.0, "scripted backend: seconds the engine takes to start, as a model "
        "loading would (while it starts /health answers starting)", minimum=0,
    ),
    "children": FactoryField(
        (int,), 0, "scripted backend: idle child processes to start, as native engines do",
        minimum=0,
    ),
    "max_restarts": FactoryField(
        (int,), 3, "restarts of an exited stage process allowed within restart_window_s; "
        "past the budget the stage cools down (restarting, 503 with Retry-After) until the "
        "oldest restart leaves the window, then restarts (0: never restart; the server stays "
        "unhealthy)", minimum=0,
    ),
    "restart_window_s": FactoryField(
        (int, float), 600.0, "seconds over which max_restarts is counted (a sliding window): "
        "the longest a stage past its budget stays down", minimum=0.001
    ),
    "restart_backoff_s": FactoryField(
        (int, float), 1.0, "wait before the first restart; doubles with each restart in the "
        "window (at most 60 s)", minimum=0
    ),
    "heartbeat_interval_s": FactoryField(
        (int, float), 1.0, "seconds between heartbeats the server sends the stage",
        minimum=0.01,
    ),
    "stall_timeout_s": FactoryField(
        (int, float), 3.0, "a stage that answers no heartbeat for this long (a frozen process) "
        "is stalled: its requests fail and it is killed and restarted", minimum=0.01
    ),
    "progress_timeout_s": FactoryField(
        (int, float), None, "a stage holding a job whose engine reports no progress on any (no "
        "denoising step, token batch, model call's return, result or error) for this long is "
        "hung: its requests fail and it is killed and restarted (0: never; unset: 60 s, but "
        "600 s for native generation without the cancellation plugin, which reports no steps, "
        "and never for the native Reasoner, guarded by native SGLang's own watchdog)", minimum=0
    ),
}


@dataclass(frozen=True)
class StageSpec:
    """A stage a pipeline declares.

    ``role`` is ``reasoner``, ``generation`` or ``orchestrator``; ``process`` says whether the
    stage runs in its own OS process (the orchestrator lives in the server process).
    """

    name: str
    role: str
    default_gpu: int | None
    process: bool = True
    factory_fields: dict[str, FactoryField] = field(default_factory=dict)


@dataclass(frozen=True)
class StageConfig:
    """A stage after merging defaults, file and flags. ``gpu`` is a visible GPU index or None."""

    name: str
    role: str
    process: bool
    gpu: int | None
    gpu_memory_fraction: float | None
    factory: dict[str, Any]
    engine: dict[str, Any]

    @property
    def backend(self) -> str:
        return self.factory.get("backend", "native")

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "gpu_memory_fraction": self.gpu_memory_fraction,
            "factory": dict(self.factory),
            "engine": dict(self.engine),
        }


@dataclass(frozen=True)
class ResolvedConfig:
    """The whole validated configuration the server runs."""

    config_cls: str
    model_path: str | None
    stages: dict[str, StageConfig]
    allowed_local_media_path: str | None = None
    allowed_media_domain: tuple[str, ...] = ()
    server: ServerSettings = field(default_factory=ServerSettings)
    #: Modules outside Omni whose import registers model packages (``model_packages``).
    model_packages: tuple[str, ...] = ()

    def stage(self, name: str) -> StageConfig:
        return self.stages[name]

    def process_stages(self) -> list[StageConfig]:
        return [s for s in self.stages.values() if s.process]

    def pipeline(self) -> type[PipelineConfig]:
        return pipeline_class(self.config_cls, self.model_packages)

    def to_dict(self) -> dict[str, Any]:
        extra = {"model_packages": list(self.model_packages)} if self.model_packages else {}
        return {
            "config_cls": self.config_cls,
            "model_path": self.model_path,
            "allowed_local_media_path": self.allowed_local_media_path,
            "allowed_media_domain": list(self.allowed_media_domain),
            "server": self.server.to_dict(),
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            **extra,
        }


class PipelineConfig:
    """Base of pipeline config classes: subclasses set ``stage_specs`` and ``mode``.

    ``mode`` tells the server which routes it serves: ``umm`` (interleaved), ``generation``
    (direct generation) or ``chat`` (text-only Reasoner).
    """

    stage_specs: ClassVar[tuple[StageSpec, ...]] = ()
    mode: ClassVar[str] = ""
    #: The model this pipeline serves (:class:`~.model_protocols.ModelProtocol`: in practice a
    #: ``contract.model.ServedModel``, with its generation limits, defaults and action handling),
    #: which the HTTP layer asks instead of importing the model package; None: the generic one.
    model: ClassVar[ModelProtocol | None] = None
    #: The pipeline ``--text-only`` selects (the first registered one that says so).
    text_only: ClassVar[bool] = False

    @classmethod
    def spec(cls, name: str) -> StageSpec | None:
        return next((s for s in cls.stage_specs if s.name == name), None)

    @classmethod
    def validate(cls, config: ResolvedConfig) -> None:
        """Cross-field checks of a resolved config; raise ConfigError naming key and fix."""

    @classmethod
    def umm_adapter(cls) -> DecisionRenderer | None:
        """The pipeline's UMM adapter class, whose decision format its stage engines write
        (:class:`~.model_protocols.DecisionRenderer`; given at start-up as
        ``EngineSpec.umm_adapter``); None when it has none."""
        return None


#: The model packages register their pipeline config classes (``register_pipeline``) when
#: imported. Config names no model: they are found by their ``sglang_omni.models`` entry points
#: (the built-in one always, :mod:`.model_imports`), and a config may name more modules in its
#: ``model_packages``.
_REGISTRY: dict[str, type[PipelineConfig]] = {}
_LOADED: set[str] = set()
_ENTRY_POINTS_LOADED = False


def register_pipeline(cls: type[PipelineConfig]) -> type[PipelineConfig]:
    """Class decorator: make ``cls`` selectable by its name as ``config_cls``; a model package
    applies it to its pipeline config classes (a later class of the same name wins)."""
    _REGISTRY[cls.__name__] = cls
    return cls


def load_model_packages(packages: tuple[str, ...] | list[str] = ()) -> None:
    """Load the model packages' entry points (once per process: the built-in first) and import
    each module of ``packages`` (``model_packages``), once each: loading one registers its
    pipelines. ConfigError names an entry point that fails to load, and a module that is not a
    module name, cannot be imported or fails as it is (:mod:`.model_imports`)."""
    global _ENTRY_POINTS_LOADED
    if not _ENTRY_POINTS_LOADED:
        for ep in model_entry_points():
            if ep.value not in _LOADED:
                load_entry_point(ep)
                _LOADED.add(ep.value)
        _ENTRY_POINTS_LOADED = True
    for name in packages:
        if name not in _LOADED:
            import_model_package(name)
            _LOADED.add(name)


def pipeline_class(name: str,
                   packages: tuple[str, ...] | list[str] = ()) -> type[PipelineConfig]:
    """The pipeline config class called ``name``, after the model ``packages`` (and the
    built-in models) registered theirs; ConfigError names the choices."""
    load_model_packages(packages)
    if name not in _REGISTRY:
        known = ", ".join(registered_pipelines())
        raise ConfigError(
            f"config_cls: unknown pipeline config class {name!r}; use one of: {known}"
        )
    return _REGISTRY[name]


def text_only_pipeline(packages: tuple[str, ...] | list[str] = ()) -> str:
    """The ``config_cls`` that ``--text-only`` selects: the first registered pipeline with
    ``text_only`` set (the built-in models register first); ConfigError when none has it."""
    load_model_packages(packages)
    for name, cls in _REGISTRY.items():
        if cls.text_only:
            return name
    raise ConfigError("--text-only: no registered pipeline serves text-only chat")


def registered_pipelines() -> list[str]:
    """Every selectable ``config_cls`` name (the built-in models' and those registered so far),
    sorted."""
    load_model_packages()
    return sorted(_REGISTRY)
