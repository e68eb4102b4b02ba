"""Counters of the media this process fetched and refused, for the server's metrics.

One :data:`MEDIA_STATS` per process. The server process counts its own; a stage process sends
its counters with every heartbeat answer and the server adds them up (so media a stage fetched
itself, as the Reasoner stages do, are counted too).

Refusal reasons: ``policy`` (the media policy refused the reference: a local path, a private
address, a domain off the allowlist, a redirect off it), ``size`` (over the file size limit or
the request's ``max_media_bytes``), ``not_found`` (the host answered 404), ``timeout`` and
``failed`` (the host failed, broke the connection or could not be reached).
"""

from __future__ import annotations

import threading
from typing import Any

REFUSAL_REASONS = ("policy", "size", "not_found", "timeout", "failed")


class MediaStats:
    """Thread-safe counters; :meth:`snapshot` is what a stage sends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fetches = 0
        self.bytes = 0
        #: Bytes received so far, counted as they arrive (fetches in progress included): a
        #: stage whose count moves is making progress on its jobs (``runtime.supervisor``).
        self.receiving = 0
        self.refusals: dict[str, int] = {}

    def received(self, size: int) -> None:
        with self._lock:
            self.receiving += size

    def fetched(self, size: int) -> None:
        with self._lock:
            self.fetches += 1
            self.bytes += size

    def refused(self, reason: str) -> None:
        with self._lock:
            self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"fetches": self.fetches, "bytes": self.bytes,
                    "receiving": self.receiving, "refusals": dict(self.refusals)}


MEDIA_STATS = MediaStats()


def add_snapshots(*snapshots: dict[str, Any]) -> dict[str, Any]:
    """The sum of several :meth:`MediaStats.snapshot` values (missing keys count 0)."""
    total: dict[str, Any] = {"fetches": 0, "bytes": 0, "refusals": {}}
    for snap in snapshots:
        total["fetches"] += int(snap.get("fetches", 0) or 0)
        total["bytes"] += int(snap.get("bytes", 0) or 0)
        for reason, count in (snap.get("refusals") or {}).items():
            total["refusals"][reason] = total["refusals"].get(reason, 0) + int(count)
    return total
