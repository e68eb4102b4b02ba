"""Request ids: every request gets a fresh one, or the client's; no two requests in flight share
one, and an id is not reused soon after its request ended.

The life of an id: ``claim`` when the request arrives (in flight), then exactly one of
``finish`` (the request ended after its work started: the id is remembered for ``window_s``) or
``forget`` (the request was refused before any work, with a 400 or 503: the id is free again, so
a client may retry with it). Memory is bounded: finished ids are forgotten after ``window_s`` and,
beyond ``capacity`` of them, oldest first; ids in flight are bounded by the server's admission
(and by ``capacity``, as a guard against a claim never ended).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

from sglang_omni.errors import BadRequest

log = logging.getLogger("sglang_omni.request_ids")

WINDOW_S = 600.0
"""How long a finished request's id stays taken (10 minutes)."""
CAPACITY = 100_000
"""The most finished ids remembered (about 26 MB of 32-character ids)."""
MAX_ID_CHARS = 256


class RequestIds:
    """Hands out request ids; refuses a client id in flight or finished within ``window_s``.

    Use from one thread (the server's event loop). ``clock`` is monotonic seconds.
    """

    def __init__(self, window_s: float = WINDOW_S, capacity: int = CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if window_s < 0 or capacity < 1:
            raise ValueError("window_s must be >= 0 and capacity >= 1")
        self.window_s = window_s
        self.capacity = capacity
        self._clock = clock
        self._in_flight: OrderedDict[str, None] = OrderedDict()
        self._finished: OrderedDict[str, float] = OrderedDict()  # rid -> when, oldest first

    def __len__(self) -> int:
        """Ids remembered now (in flight and recently finished)."""
        return len(self._in_flight) + len(self._finished)

    def new(self) -> str:
        """A fresh id that is not remembered, for routes that take no client id (a random
        128-bit id collides with nothing)."""
        return uuid.uuid4().hex

    def claim(self, client_id: object = None) -> str:
        """Put a fresh id, or ``client_id``, in flight; BadRequest if the client's id is in
        flight or finished less than ``window_s`` ago. End it with ``finish`` or ``forget``."""
        if client_id is None:
            rid = uuid.uuid4().hex
        else:
            if not isinstance(client_id, str) or not client_id \
                    or len(client_id) > MAX_ID_CHARS:
                raise BadRequest(f"rid: expected a non-empty string of at most {MAX_ID_CHARS} "
                                 "characters")
            rid = client_id
            self._expire()
            if rid in self._in_flight:
                raise BadRequest(f"rid: request id {rid!r} is already in use by a request in "
                                 "flight; use a fresh request ID for every request (or leave "
                                 "rid out)")
            if rid in self._finished:
                raise BadRequest(
                    f"rid: request id {rid!r} was used by a request that ended less than "
                    f"{self.window_s:g} s ago; use a fresh request ID for every request (or "
                    "leave rid out)")
        self._in_flight[rid] = None
        if len(self._in_flight) > self.capacity:
            oldest, _ = self._in_flight.popitem(last=False)
            log.warning("more than %d request ids in flight; forgetting the oldest (%r): a "
                        "request that never ended?", self.capacity, oldest)
        return rid

    def finish(self, rid: str) -> None:
        """The request ended after its work started: keep its id taken for ``window_s``.
        A no-op for an id not in flight (already ended, forgotten or never claimed)."""
        if rid not in self._in_flight:
            return
        del self._in_flight[rid]
        self._finished[rid] = self._clock()
        self._finished.move_to_end(rid)
        self._expire()
        while len(self._finished) > self.capacity:
            self._finished.popitem(last=False)

    def forget(self, rid: str) -> None:
        """The request was refused before any work: its id may be used again at once."""
        self._in_flight.pop(rid, None)

    def _expire(self) -> None:
        cutoff = self._clock() - self.window_s
        while self._finished:
            rid, at = next(iter(self._finished.items()))
            if at > cutoff:
                break
            del self._finished[rid]
