"""Messages of ``WS /v1/realtime_video/generate`` (msgpack maps, as native's realtime route).

The session starts with an ``init`` message: the video route's fields plus ``first_frame``
(image bytes, or a path or URL under the media policy), ``max_chunks`` and, as native declares
it, ``condition_inputs`` (Cosmos3 takes none). Then ``event`` messages steer the session.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from sglang_omni.errors import BadRequest
from sglang_omni.serve.schemas.direct import VideoGenerationRequest
from sglang_omni.serve.schemas.fields import WireModel, checked, documented


def _literal(word: str) -> Any:
    def rule(value: Any) -> None:
        if value != word:
            raise BadRequest(f"expected {word!r}, got {str(value)[:40]!r}")

    return checked(rule, {"enum": [word]})


def _positive_int(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"expected a positive integer, got {str(value)[:40]!r}")


FIRST_FRAME = documented({"oneOf": [{"type": "string", "format": "binary"},
                                    {"type": "string"}]},
                         "the image to start from: its bytes, or a path or URL")
MAX_CHUNKS = checked(_positive_int, {
    "type": "integer", "minimum": 1,
    "description": "chunks to generate before the session ends (default and most: the "
                   "server's server.max_realtime_chunks, 100 unless set)"})
NO_CONDITIONS = documented({"type": "object"}, "refused: Cosmos3 takes no realtime conditions")


class RealtimeVideoInit(VideoGenerationRequest):
    """The first message of a realtime video session."""

    type: Annotated[Any, _literal("init")] = Field(..., description='"init"')
    first_frame: Annotated[Any, FIRST_FRAME] = None
    max_chunks: Annotated[Any, MAX_CHUNKS] = None
    condition_inputs: Annotated[Any, NO_CONDITIONS] = None


class RealtimeEvent(WireModel):
    """A message after ``init``: ``kind`` ``prompt`` with a new prompt as ``payload`` steers
    the chunks that follow."""

    type: Annotated[Any, _literal("event")] = Field(..., description='"event"')
    kind: Annotated[Any, _literal("prompt")] = Field(..., description='"prompt"')
    payload: Annotated[Any, documented({"type": "string"})] = None
    event_id: Annotated[Any, documented({"type": "integer"})] = None
