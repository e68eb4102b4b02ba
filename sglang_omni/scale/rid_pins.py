"""Client request ids across a fleet: where each one was served, so a reused id reaches the
replica that knows it.

One server refuses a client ``rid`` that is in flight or ended less than ten minutes ago
(:class:`~sglang_omni.runtime.request_ids.RequestIds`). In a fleet each replica knows only its
own ids, so the gateway remembers the replica that took each client id and sends a request
reusing it there (the routers honour the call's ``replica`` keyword): that replica refuses it
with one server's error and precedence. An id whose request was refused (4xx, 503) is let go,
as the replica lets it go: the client may retry with it anywhere.

Per gateway: with several gateways (``--gateways``) a reused id that reaches another gateway is
not caught. Memory is bounded as the replicas' is (``window_s``, ``capacity``).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sglang_omni.config.server import ServerSettings
from sglang_omni.runtime.request_ids import CAPACITY, MAX_ID_CHARS, WINDOW_S
from sglang_omni.serve.bodies.request_body import json_values_bound

#: Bodies larger than this are parsed off the event loop (see :func:`needs_thread`).
INLINE_PARSE_BYTES = 1 << 20


def client_rid(body: bytes, max_values: int = ServerSettings.max_json_values) -> str | None:
    """The ``rid`` string at the top of a JSON request body, or None (no rid, not JSON, not an
    object, a rid the replica will refuse anyway, or a body the replica refuses for holding
    more than ``max_values`` values: never parsed here). Blocking: large bodies belong in a
    thread."""
    if b'"rid"' not in body or json_values_bound(body) > max_values:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the replica answers what is wrong with the body
    rid = value.get("rid") if isinstance(value, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= MAX_ID_CHARS else None


def needs_thread(body: bytes) -> bool:
    """Whether :func:`client_rid` of ``body`` should run off the event loop."""
    return len(body) > INLINE_PARSE_BYTES and b'"rid"' in body


@dataclass
class _Pin:
    replica: str
    active: int = 0
    finished_at: float | None = None


class RidPins:
    """rid -> the replica that holds it (in flight, or ended within ``window_s`` after its work
    started). Use from one thread (the gateway's event loop); ``clock`` is monotonic seconds."""

    def __init__(self, window_s: float = WINDOW_S, capacity: int = CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.capacity = capacity
        self._clock = clock
        self._pins: OrderedDict[str, _Pin] = OrderedDict()  # least recently touched first

    def __len__(self) -> int:
        return len(self._pins)

    def replica_for(self, rid: str) -> str | None:
        """The replica holding ``rid``, or None."""
        self._expire()
        pin = self._pins.get(rid)
        if pin is None:
            return None
        if self._expired(pin):
            del self._pins[rid]
            return None
        return pin.replica

    def started(self, rid: str, replica: str) -> None:
        """A request with ``rid`` reached ``replica`` (a new replica takes over an old pin)."""
        pin = self._pins.get(rid)
        if pin is None or pin.replica != replica:
            pin = self._pins[rid] = _Pin(replica)
        pin.active += 1
        self._pins.move_to_end(rid)
        while len(self._pins) > self.capacity:
            self._pins.popitem(last=False)

    def ended(self, rid: str, replica: str, refused: bool) -> None:
        """A request with ``rid`` on ``replica`` ended; ``refused``: before any work (4xx, 503),
        so the replica let the id go."""
        pin = self._pins.get(rid)
        if pin is None or pin.replica != replica:
            return
        pin.active = max(0, pin.active - 1)
        if not refused:
            pin.finished_at = self._clock()
            self._pins.move_to_end(rid)
        if pin.active == 0 and pin.finished_at is None:
            del self._pins[rid]

    def _expired(self, pin: _Pin) -> bool:
        return (pin.active == 0 and pin.finished_at is not None
                and pin.finished_at <= self._clock() - self.window_s)

    def _expire(self) -> None:
        """Drop expired pins from the least recently touched end (memory; ``replica_for``
        checks the pin it returns)."""
        while self._pins:
            rid, pin = next(iter(self._pins.items()))
            if not self._expired(pin):
                return
            del self._pins[rid]
