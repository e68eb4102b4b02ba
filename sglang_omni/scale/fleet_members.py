"""The replicas the routers of this process were last told of (Ray's ``update_replicas``), for
the gateway's fleet reads (``GET /metrics``, ``GET /v1/videos``), which ask each of them at once,
each call pinned to its replica, instead of in turn through the router (which passes over the
replicas found silent, so a list would leave out a replica that answers again). Safe from any
thread of the process."""

from __future__ import annotations

import threading
from collections.abc import Iterable

_lock = threading.Lock()
_members: tuple[str, ...] = ()


def seen(replicas: Iterable[str]) -> None:
    """A router was told the deployment's replicas are ``replicas`` (ids)."""
    global _members
    with _lock:
        _members = tuple(sorted(replicas))


def current() -> tuple[str, ...]:
    """The replica ids last seen (none before a router of this process was told of them)."""
    with _lock:
        return _members
