"""The replicas this process's gateway found silent (a call to one brought nothing, not even its
keep-alive, for the gateway's ``replica_silence_s``: a frozen process or a blocked event loop).

The gateway marks one (:func:`mark`); the routers of this process (Ray runs them beside the
gateway, one per deployment handle) leave the marked replicas out like those a request was
refused by, unless every replica is (:func:`~sglang_omni.scale.routers.excluded`), so new
requests go to the others at once, before Ray's health checks fail it. A mark lasts
:data:`SILENT_FOR_S` (by then Ray has replaced a frozen replica; one that only paused serves
again). A mark ends sooner when the replica answers again: its routing stats recorded after
the mark (:func:`heard_from`, the routers' stats) or a fleet read (:func:`answered`). Safe from
any thread of the process.
"""

from __future__ import annotations

import threading
import time

#: Seconds a replica stays passed over after a call found it silent.
SILENT_FOR_S = 60.0

_lock = threading.Lock()
_marked: dict[str, float] = {}  # replica id -> monotonic time of its last mark
_marked_at: dict[str, float] = {}  # replica id -> wall-clock time of its last mark


def mark(replica: str) -> None:
    """Pass ``replica`` over for the next :data:`SILENT_FOR_S` seconds."""
    with _lock:
        _marked[replica] = time.monotonic()
        _marked_at[replica] = time.time()


def heard_from(replica: str, stats_at: float) -> None:
    """``replica`` recorded routing stats at wall-clock ``stats_at`` (Ray polls them every
    half second): recorded after its mark, it is running again and no longer passed over (its
    stats' health says whether it serves)."""
    with _lock:
        if replica in _marked and stats_at > _marked_at.get(replica, float("inf")):
            _marked.pop(replica, None)
            _marked_at.pop(replica, None)


def answered(replica: str) -> None:
    """``replica`` answered a call: it is not passed over any longer."""
    with _lock:
        _marked.pop(replica, None)
        _marked_at.pop(replica, None)


def silent() -> frozenset[str]:
    """The replicas marked within the last :data:`SILENT_FOR_S` seconds."""
    now = time.monotonic()
    with _lock:
        for replica in [r for r, at in _marked.items() if now - at > SILENT_FOR_S]:
            del _marked[replica]
            _marked_at.pop(replica, None)
        return frozenset(_marked)


def replica_silent(replica: str, silence_s: float) -> str:
    """The error of a request whose replica stopped answering."""
    return (f"the replica serving this request ({replica}) stopped answering: nothing came "
            f"from it for {silence_s:g} s, not even its keep-alive (its process is frozen or "
            "its event loop blocked); new requests go to other replicas, and Ray Serve "
            "replaces it once its health checks fail; retry the request")


def not_retried(replica: str, silence_s: float, why: str) -> str:
    """The error of a request whose replica stopped answering and that was not asked of
    another replica (``why``: a clause saying why)."""
    return (f"the replica serving this request ({replica}) stopped answering: nothing came "
            f"from it for {silence_s:g} s (its process is frozen or its event loop blocked); "
            f"the request was not asked of another replica: {why}; new requests go to other "
            "replicas; retry the request")


#: Why a silent call is not asked of another replica.
TAKEN = ("that replica had taken it, so asking another could run it twice; it is dropped there "
         "when that replica resumes (it neither runs nor keeps anything it made, such as a video "
         "job)")
UNFENCED = ("this gateway's call fence is not running, so it cannot stop the call from running "
            "there too when that replica resumes")


class ReplicaSilent(Exception):  # noqa: N818 - what happened, as StreamCut names it
    """A replica's call brought nothing for the gateway's ``replica_silence_s``; ``replicas``
    is the one it went to (or, before Ray confirmed which, the router's group of equals);
    ``not_retried_why``: the call never started but is not asked of another replica, why."""

    def __init__(self, replica: str, silence_s: float,
                 replicas: tuple[str, ...] | None = None, not_retried_why: str | None = None
                 ) -> None:
        super().__init__(replica_silent(replica, silence_s) if not_retried_why is None
                         else not_retried(replica, silence_s, not_retried_why))
        self.replica = replica
        self.replicas = replicas if replicas is not None else (replica,)
