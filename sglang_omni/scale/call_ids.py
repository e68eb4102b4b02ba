"""Each gateway call to the replicas under a Ray Serve request id of its own.

Ray Serve gives a handle call the internal request id of the request it is made in (the
gateway's HTTP request), and its request router hands a replica it chose for one pending call to
the pending call with that id (``RequestRouter._fulfill_next_pending_request`` looks calls up by
id, one a id, in Ray 2.60): two calls of one HTTP request pending at once (a fleet read asking
every replica at once; a retry while the first call is still being routed) can swap replicas, so
a call goes where the router chose for the other one (a retry back to the replica it
excluded), and the other waits. :func:`own_id` makes the call under a fresh id, the rest of the
request's context kept (this reads Ray's private request context: checked against Ray 2.60).
"""

from __future__ import annotations

import contextvars
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from ray.serve import context as serve_context

T = TypeVar("T")


def own_id(make: Callable[[], T]) -> T:
    """``make()`` (a handle's ``.remote(...)``) run with a request context of its own id."""

    def run() -> T:
        current = serve_context._get_serve_request_context()
        mine: Any = dataclasses.replace(current, _internal_request_id=uuid.uuid4().hex)
        serve_context._serve_request_context.set(mine)
        return make()

    return contextvars.copy_context().run(run)
