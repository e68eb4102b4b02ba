"""Direct generation (``Cosmos3PipelineConfig``): the native image, video and action routes.

Every route of the pinned SGLang release's diffusion server that serves Cosmos3, with its
request and response shapes and body formats:

* images (:mod:`.image_routes`): ``POST /v1/images/generations``, ``POST /v1/images/edits``
  (a form), ``GET /v1/images/{id}/content``;
* videos (:mod:`.video_routes`): ``POST /v1/videos`` (JSON or a form), ``GET /v1/videos[/{id}
  [/content]]``, ``DELETE /v1/videos/{id}`` (which aborts a running job; native cannot);
* actions (:mod:`.action_routes`): ``POST /v1/actions/generations`` (JSON, a form or msgpack),
  ``GET /v1/actions/metadata``, ``WS /v1/actions/realtime`` (:mod:`.realtime_actions`);
* ``WS /v1/realtime_video/generate`` (:mod:`.realtime_video`);
* ``GET /model_info`` (:mod:`.info_routes`; ``GET /server_info`` is every pipeline's).

Unlike native, every media field of every route (references, ``data:`` URLs and uploads) passes
the media policy with the chat media limits before any model work, as do the server's generation
limits; engine exception text never reaches a client (an unexpected failure answers the generic
500 and is logged). Omni keeps no files: images answered as ``url`` and finished videos are held
in memory with retention and count bounds, owned by :class:`~.direct_context.DirectContext` and
dropped at shutdown.
"""

from __future__ import annotations

from sglang_omni.pipeline.orchestrator import Orchestrator
from sglang_omni.serve.bodies.typed_route import omni_router
from sglang_omni.serve.direct.action_routes import add_action_routes
from sglang_omni.serve.direct.context import DirectContext
from sglang_omni.serve.direct.image_routes import add_image_routes
from sglang_omni.serve.direct.video_routes import add_video_routes
from sglang_omni.serve.ops.info_routes import add_info_routes
from sglang_omni.serve.ops.mode_routes import ModeRoutes, refuse_chat, refuse_generate
from sglang_omni.serve.realtime.realtime_actions import add_realtime_action_route
from sglang_omni.serve.realtime.realtime_video import add_realtime_video_route


def direct_routes(orchestrator: Orchestrator, served_name: str) -> ModeRoutes:
    """The direct generation routes over ``orchestrator``'s generation stage; what they own
    (video jobs, held images, realtime sessions) is closed at shutdown."""
    router = omni_router()
    ctx = DirectContext(orchestrator, served_name)
    add_image_routes(router, ctx)
    add_video_routes(router, ctx)
    add_action_routes(router, ctx)
    add_realtime_action_route(router, ctx)
    add_realtime_video_route(router, ctx)
    add_info_routes(router, ctx)
    refuse_chat(router, "/v1/chat/completions: this server runs Cosmos3PipelineConfig (direct "
                "generation); use the image, video and action routes")
    refuse_generate(router, orchestrator.config.config_cls)
    return ModeRoutes(router, closers=(ctx.close,))
