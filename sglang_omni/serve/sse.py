"""Server-sent events framing (written by hand: the format is two lines and we need exact
control of event names and the closing ``[DONE]``)."""

from __future__ import annotations

import json
from typing import Any


def sse_data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_event(event: str, obj: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
