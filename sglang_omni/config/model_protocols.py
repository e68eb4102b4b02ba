"""The interfaces a model package implements, as the pipeline config names them.

A pipeline config class (``config.schema.PipelineConfig``) holds its model in two slots:
``model``, the served model the HTTP layer and the pipeline ask (its defaults, limits and action
route), typed :class:`ModelProtocol`; and ``umm_adapter()``, whose decision format the engines
write, typed :class:`DecisionRenderer`. They live here, at the config's level, so that the
config can type its slots while every layer above (the contract's ``ServedModel``, engines, the
pipeline, the model packages, the routes) imports them; nothing here imports a model or engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from sglang_omni.config.server import ServerSettings


class GenerationDefaults(Protocol):
    """What a generation gets for the options it leaves out (``contract.generation_limits
    .Defaults``)."""

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def frames(self) -> int: ...

    @property
    def fps(self) -> int: ...


@runtime_checkable
class ModelProtocol(Protocol):
    """A served model as the routes and the pipeline see it: every member they use. The
    contract's ``ServedModel`` implements it (the generic model); a model package subclasses
    that and sets an instance as its pipeline configs' ``model``."""

    @property
    def name(self) -> str:
        """The model's name in messages."""

    @property
    def defaults(self) -> GenerationDefaults:
        """What a generation on the native backend gets for the options it leaves out."""

    @property
    def action_defaults(self) -> GenerationDefaults:
        """What an action request gets for the options it leaves out."""

    @property
    def size_multiples(self) -> Mapping[str, int]:
        """The width/height multiple each generation backend needs (absent: none)."""

    @property
    def max_side(self) -> int | None:
        """The largest width or height the model makes (None: the server's limits only)."""

    def generation_defaults(self, backend: Any) -> GenerationDefaults:
        """What a generation on ``backend`` gets for the options it leaves out."""

    def default_size(self, backend: Any) -> tuple[int, int]:
        """The width and height a generation on ``backend`` makes for sides left out."""

    def size_multiple(self, backend: Any) -> int:
        """The width/height multiple the generation backend needs (1: none)."""

    def check_generation_limits(self, options: Mapping[str, Any], settings: ServerSettings, *,
                                backend: Any = None, where: str = "", video: bool = True,
                                action: bool = False, multiple: int = 1,
                                feeds_reasoner: bool = False) -> None:
        """BadRequest (400) when ``options`` ask for more than the server or model allow."""

    def check_action_request(self, body: dict[str, Any],
                             check_media: Callable[..., Any]) -> dict[str, Any]:
        """The checked action request body; 400 when the model answers no actions."""

    def action_response_format(self, body: dict[str, Any]) -> str:
        """``envelope`` or ``raw``: the answer's shape the action request asks for."""

    def action_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """The fields of a checked action request, flattened as the engine reads them."""

    def plan_action(self, fields: dict[str, Any]) -> None:
        """The model's own checks of an action request (400 with its message)."""

    def action_metadata(self, served_name: str, model_path: str | None, backend: str,
                        engine_args: dict[str, Any]) -> dict[str, Any]:
        """``GET /v1/actions/metadata``: what the action route takes and returns."""


class DecisionRenderer(Protocol):
    """What an engine asks of a pipeline's UMM adapter (``PipelineConfig.umm_adapter()``, given
    to the stage at start-up as ``EngineSpec.umm_adapter``): the scripted Reasoner writes a
    neutral script decision (``{"action": "image", "prompt": ...}``, ``{"action": "final",
    "text": ...}``) in the adapter's decision format. An adapter class implements it with a
    static method. This is every adapter member an engine calls."""

    def render_decision(self, entry: dict[str, Any]) -> str:
        """``entry`` as the model's Reasoner would write that decision."""
