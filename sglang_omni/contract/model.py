"""``ServedModel``: what the HTTP layer asks of the model it serves (the generic model, which
implements ``config.model_protocols.ModelProtocol``, the pipeline config's ``model`` slot).

A model package (``sglang_omni.models.cosmos3``, or one outside Omni named by the config's
``model_packages``) sets its pipeline config classes' ``model`` to an instance; the routes reach
it through :func:`served_model` and never import the model package. It says which generations
the model makes for options left out, the sizes its engines take, and how its action route
reads, checks and describes a request. This base is the generic model: the server's limits
alone, the scripted/hf engines' square default, and no action route.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.config.server import ServerSettings
from sglang_omni.contract import generation_limits
from sglang_omni.contract.generation_limits import Defaults
from sglang_omni.contract.generation_options import DEFAULT_FPS, DEFAULT_SIZE, DEFAULT_VIDEO_FRAMES
from sglang_omni.errors import BadRequest


class ServedModel:
    """A model as the routes see it; subclasses override the attributes and methods that
    differ. Instances are stateless and shared."""

    #: The model's name in messages.
    name: str = "model"
    #: What a generation on the native backend gets for the options it leaves out.
    defaults: Defaults = Defaults(DEFAULT_SIZE, DEFAULT_SIZE, DEFAULT_VIDEO_FRAMES, DEFAULT_FPS)
    #: What an action request gets for the options it leaves out.
    action_defaults: Defaults = defaults
    #: The width/height multiple each generation backend needs (absent: none).
    size_multiples: Mapping[str, int] = {}
    #: The largest width or height the model makes (None: only the server's limits apply).
    max_side: int | None = None

    def generation_defaults(self, backend: Any) -> Defaults:
        """What a generation on ``backend`` gets for the options it leaves out (the one home
        of the per-backend defaults): the hf and scripted engines' square ``DEFAULT_SIZE``
        (videos as :attr:`defaults`), else :attr:`defaults` (the native engine's)."""
        if str(backend) in ENGINE_BACKENDS:
            return Defaults(DEFAULT_SIZE, DEFAULT_SIZE, self.defaults.frames, self.defaults.fps)
        return self.defaults

    def default_size(self, backend: Any) -> tuple[int, int]:
        """The width and height a generation on ``backend`` makes for sides left out."""
        defaults = self.generation_defaults(backend)
        return defaults.width, defaults.height

    def size_multiple(self, backend: Any) -> int:
        """The width/height multiple the generation stage's backend needs (1: none)."""
        return self.size_multiples.get(str(backend), 1)

    def check_generation_limits(self, options: Mapping[str, Any], settings: ServerSettings, *,
                                backend: Any = None, where: str = "", video: bool = True,
                                action: bool = False, multiple: int = 1,
                                feeds_reasoner: bool = False) -> None:
        """BadRequest (400) when ``options`` ask for more than the server's ``settings`` or
        this model allow (``contract.generation_limits``); a side left out counts as what the
        generation stage's ``backend`` makes of it (:meth:`generation_defaults`; None: the
        native engine); ``action``:
        an action request's options (:attr:`action_defaults` fill the gaps)."""
        generation_limits.check_generation_limits(
            options, settings, where=where, video=video, multiple=multiple,
            defaults=self.action_defaults if action else self.generation_defaults(backend),
            feeds_reasoner=feeds_reasoner, max_side=self.max_side, model=self.name)

    # --- the direct action route (``POST /v1/actions``) ---------------------------------------
    def check_action_request(self, body: dict[str, Any],
                             check_media: Callable[..., Any]) -> dict[str, Any]:
        """The checked action request body (its media checked by ``check_media``); 400 when
        the model answers no actions."""
        raise BadRequest(f"/v1/actions: the {self.name} model answers no action requests")

    def action_response_format(self, body: dict[str, Any]) -> str:
        """The answer's shape the action request asks for: ``envelope`` (the action route's
        envelope) or ``raw`` (the model's own output)."""
        return "envelope"

    def action_fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """The fields of a checked action request, flattened as the engine reads them."""
        return dict(body)

    def plan_action(self, fields: dict[str, Any]) -> None:
        """The model's own checks of an action request (400 with its message)."""

    def action_metadata(self, served_name: str, model_path: str | None, backend: str,
                        engine_args: dict[str, Any]) -> dict[str, Any]:
        """``GET /v1/actions/metadata``: what the action route takes and returns."""
        return {"object": "action.metadata", "model": served_name, "model_path": model_path,
                "capabilities": {"action_modes": []}}


#: The backends whose generations are ``DEFAULT_SIZE`` square where a side is left out.
ENGINE_BACKENDS = ("hf", "scripted")
#: The model of a pipeline that names none.
GENERIC = ServedModel()


def served_model(config: ResolvedConfig) -> ServedModel:
    """The model the configured pipeline serves (``PipelineConfig.model``), read from the
    model registry; the generic one when the pipeline names none."""
    model = config.pipeline().model
    if model is None:
        return GENERIC
    if not isinstance(model, ServedModel):
        raise TypeError(f"{config.config_cls}.model: expected a contract.model.ServedModel, "
                        f"got {type(model).__name__}")
    return model
