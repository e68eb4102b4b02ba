"""``Threads``: the owner of the threads a component starts, which joins them when it stops.

Every thread Omni starts in a stage process is started through a :class:`Threads` (the stage's
reader and server watch, a native generation's calls, worker watch and release, a video's
encoder). Its threads are daemons, so one stuck in a call that never returns (a dead native
worker) cannot keep the process alive; but none is left to the interpreter: the owner stops its
threads (its own way: a socket shut down, an event set, a queue told) and :meth:`Threads.join`
joins them, each for a bounded time, logging by name any thread that did not stop.
:func:`join_all` joins the threads of every owner still holding one (a stage process calls it
as it exits).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sglang_omni.aio")

_owners: weakref.WeakSet[Threads] = weakref.WeakSet()
_owners_lock = threading.Lock()


class Threads:
    """The threads one component started (``owner`` names it in the log); thread-safe. A
    thread is forgotten as it ends (nothing it references is kept)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._lock = threading.Lock()
        self._threads: dict[threading.Thread, Callable[[], None] | None] = {}
        with _owners_lock:
            _owners.add(self)

    def start(self, target: Callable[..., Any], *args: Any, name: str,
              stop: Callable[[], None] | None = None) -> threading.Thread:
        """Start ``target(*args)`` on a daemon thread named ``name``, owned here; ``stop``
        (from any thread) makes it end soon, where it can be told."""
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.pop(thread, None)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads[thread] = stop
        thread.start()
        return thread

    def alive(self) -> list[threading.Thread]:
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def join(self, timeout_s: float) -> list[str]:
        """Tell every thread started here to stop (its ``stop``), then join them all within
        ``timeout_s`` seconds; the names of those still running, each logged (a warning)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            stops = [stop for stop in self._threads.values() if stop is not None]
        for stop in stops:
            try:
                stop()
            except Exception:  # noqa: BLE001 - one stop's failure must not keep the others
                log.exception("%s: stopping a thread failed", self.owner)
        current = threading.current_thread()
        for thread in self.alive():
            if thread is not current:
                thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in self.alive() if t is not current]
        for name in left:
            log.warning("%s: thread %s did not stop within %.1f s of its owner's stop; it is "
                        "left running as a daemon", self.owner, name, timeout_s)
        return left


def join_all(timeout_s: float) -> list[str]:
    """:meth:`Threads.join` on every owner still holding a running thread, all within
    ``timeout_s`` seconds; the names of the threads still running."""
    deadline = time.monotonic() + timeout_s
    with _owners_lock:
        owners = [o for o in _owners if o.alive()]
    left: list[str] = []
    for owner in owners:
        left += owner.join(max(0.0, deadline - time.monotonic()))
    return left
