"""The replicas this process's gateway found silent (a call to one brought nothing, not even its
keep-alive, for the gateway's ``replica_silence_s``: a frozen process or a blocked event loop).

The gateway marks one (:func:`mark`); the routers of this process (Ray runs them beside the
gateway, one per deployment handle) leave the marked replicas out like those a request was
refused by, unless every replica is (:func:`~sglang_omni.scale.routers.excluded`), so new
requests go to the others at once, before Ray's health checks fail it. A mark lasts
:data:`SILENT_FOR_S` (by then Ray has replaced a frozen replica; one that only paused serves
again). Safe from any thread of the process.
"""

from __future__ import annotations

import threading
import time

#: Seconds a replica stays passed over after a call found it silent.
SILENT_FOR_S = 60.0

_lock = threading.Lock()
_marked: dict[str, float] = {}  # replica id -> monotonic time of its last mark


def mark(replica: str) -> None:
    """Pass ``replica`` over for the next :data:`SILENT_FOR_S` seconds."""
    with _lock:
        _marked[replica] = time.monotonic()


def silent() -> frozenset[str]:
    """The replicas marked within the last :data:`SILENT_FOR_S` seconds."""
    now = time.monotonic()
    with _lock:
        for replica in [r for r, at in _marked.items() if now - at > SILENT_FOR_S]:
            del _marked[replica]
        return frozenset(_marked)


def replica_silent(replica: str, silence_s: float) -> str:
    """The error of a request whose replica stopped answering."""
    return (f"the replica serving this request ({replica}) stopped answering: nothing came "
            f"from it for {silence_s:g} s, not even its keep-alive (its process is frozen or "
            "its event loop blocked); new requests go to other replicas, and Ray Serve "
            "replaces it once its health checks fail; retry the request")


class ReplicaSilent(Exception):  # noqa: N818 - what happened, as StreamCut names it
    """A replica's call brought nothing for the gateway's ``replica_silence_s``; ``replicas``
    is the one it went to (or, before Ray confirmed which, the router's group of equals)."""

    def __init__(self, replica: str, silence_s: float,
                 replicas: tuple[str, ...] | None = None) -> None:
        super().__init__(replica_silent(replica, silence_s))
        self.replica = replica
        self.replicas = replicas if replicas is not None else (replica,)
