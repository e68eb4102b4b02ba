"""Server-sent events framing (written by hand: the format is two lines and we need exact
control of event names and the closing ``[DONE]``).

Data is JSON with every non-ASCII character escaped: SSE ends lines only at CR and LF, but
common line readers (``str.splitlines``, httpx's ``iter_lines``, the SDK) also split at U+2028,
U+2029, NEL and other separators, which would cut a raw answer holding them in two.
"""

from __future__ import annotations

import json
from typing import Any


def sse_data(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def sse_event(event: str, obj: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
