"""Where this process's routers last sent each gateway call, and when (by the call's
``call_id``), so that the gateway can tell a router that holds a call (the deadline router's
``max_wait_s``: it sends the call nowhere yet) from a replica that was sent the call and never
answered it (its process frozen just then, its event loop blocked).

A router notes every choice it makes for a call (:func:`chose`; no replica while it holds the
call, and Ray asks it again within half a second), and the replica Ray confirms the call went
to (:func:`routed`); the gateway reads the note while it waits for the call's first item
(:func:`sent_to`) and forgets it when the call ends (:func:`forget`). A call's silence counts
from the latest note: a router still choosing is not silence. Safe from any thread of the
process (Ray may run its routers on a loop of their own).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sglang_omni.scale import silent_replicas
from sglang_omni.scale.silent_replicas import ReplicaSilent

#: Notes kept at most; past it, those older than :data:`STALE_S` are dropped (calls that
#: ended without the gateway forgetting them: a test's handle, a call cancelled early).
MAX_NOTES = 4096
STALE_S = 600.0


@dataclass(frozen=True)
class Sent:
    """The replicas a call may have gone to (one once Ray confirmed it; a router's group of
    equals before that; none while the router holds the call), and the monotonic time of the
    note."""

    replicas: tuple[str, ...]
    at: float


_lock = threading.Lock()
_notes: dict[str, Sent] = {}


def chose(call_id: str | None, replicas: tuple[str, ...]) -> None:
    """A router chose ``replicas`` (its first group; empty: it holds the call) for the call."""
    if call_id is None:
        return
    now = time.monotonic()
    with _lock:
        if len(_notes) >= MAX_NOTES:
            for key in [k for k, v in _notes.items() if now - v.at > STALE_S]:
                del _notes[key]
        _notes[call_id] = Sent(tuple(replicas), now)


def routed(call_id: str | None, replica: str) -> None:
    """Ray confirmed the call went to ``replica`` (it accepted the call)."""
    chose(call_id, (replica,))


def sent_to(call_id: str) -> Sent | None:
    """The call's latest note, or None when no router has chosen for it yet."""
    with _lock:
        return _notes.get(call_id)


def forget(call_id: str) -> None:
    with _lock:
        _notes.pop(call_id, None)


async def first_item(call: AsyncIterator[Any], call_id: str, silence_s: float,
                     on_silent: Callable[[], Awaitable[bool]] | None = None) -> Any:
    """The call's first item (the replica's id). ReplicaSilent when a router sent the call
    somewhere and nothing came for ``silence_s`` since its latest note (a replica frozen before
    its first reply: the one Ray confirmed is marked silent), unless ``on_silent()`` says False
    (the call's answer is known to be on its way: it is waited for with no limit here); while
    no router has sent it (the deadline router's hold, Ray still choosing) the wait is not
    limited here."""
    first = asyncio.ensure_future(anext(call))
    poll_s = min(0.5, silence_s / 4)
    patient = False
    try:
        while True:
            done, _ = await asyncio.wait({first}, timeout=None if patient else poll_s)
            if done:
                return first.result()
            sent = sent_to(call_id)
            if sent is None or not sent.replicas or time.monotonic() - sent.at < silence_s:
                continue
            if len(sent.replicas) == 1:
                silent_replicas.mark(sent.replicas[0])
            if on_silent is not None and not await on_silent():
                patient = True
                continue
            raise ReplicaSilent(" or ".join(sent.replicas), silence_s, sent.replicas)
    finally:
        first.add_done_callback(_retrieved)
        first.cancel()


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # seen: an abandoned first read's failure is not logged as unretrieved
