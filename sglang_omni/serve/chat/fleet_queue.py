"""What a fleet gateway tells the server it forwards a request to: how long the request waited
in the gateway's queue before it was sent. The interleaved pipeline counts the request's
deadline (``timeout_s``) from its arrival at the gateway, so a request served by a fleet ends when
it would on one server.

The value travels in the ASGI scope (:data:`WAITED_S_KEY`), which only the process serving the
app builds: an HTTP client cannot set it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: The ASGI scope key the replica sets (seconds, a float >= 0).
WAITED_S_KEY = "sglang_omni.waited_s"


def waited_s(scope: Mapping[str, Any]) -> float:
    """Seconds the request waited before it reached this server; 0 when none was recorded
    (a client's own request) or the value is not a finite number >= 0."""
    value = scope.get(WAITED_S_KEY, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return max(0.0, float(value))
