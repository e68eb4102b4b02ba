"""What a replica undoes for a call its gateway abandoned (:mod:`~sglang_omni.scale.call_fence`):
the client was answered with an error, so what the call made must not outlive it.

A call that creates a held result (``POST /v1/videos``: a video job, which starts at once) has
made it by the time its answer is ready; dropping the answer alone would leave a job that runs
and is listed though no client knows its id. :func:`undo_request` names the request that
removes it (the app's own ``DELETE /v1/videos/{id}``, which cancels a queued or running job),
read from the answer the client never got. Any other call's effect ends with the call (a
generation is aborted when its call is closed).
"""

from __future__ import annotations

import json
from typing import Any

from sglang_omni.scale.asgi_call import Message

#: The routes whose 200 answer names a held result it made, and where that result is deleted.
UNDO = {("POST", "/v1/videos"): "/v1/videos/{id}"}


def makes_held_result(request: dict[str, Any]) -> bool:
    """Whether ``request`` creates a held result that an abandoned call must delete."""
    return (request["method"], request["path"].rstrip("/")) in UNDO


def undo_request(request: dict[str, Any], messages: list[Message]) -> dict[str, Any] | None:
    """The forwarded request that deletes what ``request`` made, given its whole answer
    (``messages``); None when it made nothing (an error answer) or nothing needs deleting."""
    route = UNDO.get((request["method"], request["path"].rstrip("/")))
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    if route is None or start is None or start["status"] != 200:
        return None
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    try:
        made = json.loads(body)["id"]
    except (ValueError, KeyError, TypeError):
        return None
    path = route.format(id=made)
    return {**request, "method": "DELETE", "path": path, "raw_path": path.encode(),
            "query_string": b"", "body": b""}
