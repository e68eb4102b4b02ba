"""A development aid: find the callbacks that hold the server's event loop.

With ``SGLANG_OMNI_SLOW_CALLBACK_S`` set to seconds (``0.05``), the server runs on the standard
library's asyncio loop in debug mode (its checks of calls from other threads and of coroutines
never awaited) and logs each callback that held the loop that long::

    Executing <Task ... coro=<...> running at FILE:LINE> took 0.061 seconds (0.058 s of CPU,
    blocked 0 times, preempted 1 times)

A callback holds the loop when it computes that long (its thread's CPU time) or when it blocks
(a sleep, a join, a file or socket wait: the thread gave up its core) and was never preempted,
unless the process's other threads ran for at least half its wait (it waited for the interpreter
lock while worker threads did the work handed off the loop: not the callback's doing).
Time spent waiting for a core on a busy machine is not holding the loop, so asyncio's own
wall-clock warning is kept for a loop held :data:`WALL_CLOCK_S` (whatever the cause) only.
Long garbage collections are logged too. Unset, nothing changes: uvicorn's choice of loop, no
debug mode, no cost.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import time
from typing import Any

log = logging.getLogger("sglang_omni.loop")

SLOW_CALLBACK_ENV = "SGLANG_OMNI_SLOW_CALLBACK_S"
#: asyncio's own (wall-clock) slow-callback warning in this mode.
WALL_CLOCK_S = 1.0

_original_run = asyncio.events.Handle._run
_limit_s: float | None = None


def slow_callback_s() -> float | None:
    """The threshold :data:`SLOW_CALLBACK_ENV` sets, None when unset (or not a number)."""
    value = os.environ.get(SLOW_CALLBACK_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        log.warning("%s=%r is not a number of seconds; ignored", SLOW_CALLBACK_ENV, value)
        return None
    return seconds if seconds > 0 else None


def watch(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """Log the callbacks of ``loop`` (the standard library's) that hold it ``seconds`` or more,
    and garbage collections that long; puts ``loop`` in debug mode."""
    global _limit_s
    _limit_s = seconds
    setattr(asyncio.events.Handle, "_run", _timed_run)  # noqa: B010 - patched on purpose
    loop.set_debug(True)
    loop.slow_callback_duration = max(seconds, WALL_CLOCK_S)
    gc.callbacks.append(_garbage_collection(seconds))
    log.info("asyncio debug mode: callbacks holding the loop %g s or more are logged", seconds)


def _timed_run(handle: asyncio.Handle) -> None:
    limit = _limit_s
    if limit is None:
        _original_run(handle)
        return
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    before = resource.getrusage(resource.RUSAGE_THREAD)
    _original_run(handle)
    wall = time.perf_counter() - wall
    if wall < limit:
        return
    cpu = time.thread_time() - cpu
    others = time.process_time() - process - cpu
    after = resource.getrusage(resource.RUSAGE_THREAD)
    blocked = after.ru_nvcsw - before.ru_nvcsw
    preempted = after.ru_nivcsw - before.ru_nivcsw
    if cpu >= limit or (blocked and not preempted and not gil_wait(wall - cpu, others)):
        log.warning("Executing %s took %.3f seconds (%.3f s of CPU, blocked %d times, "
                    "preempted %d times)", _describe(handle), wall, cpu, blocked, preempted)


def gil_wait(waited_s: float, others_cpu_s: float) -> bool:
    """Whether a callback's wait (``waited_s``: its time off its core) was for the interpreter
    lock: the process's other threads ran at least half that long meanwhile (worker threads
    doing the work handed off the loop, held up themselves on a busy machine); the callback did
    not block the loop by itself."""
    return others_cpu_s >= waited_s / 2


def _describe(handle: asyncio.Handle) -> str:
    """The task a handle steps, else the handle (as asyncio's own warning names them)."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    return repr(owner) if isinstance(owner, asyncio.Task) else repr(handle)


def _garbage_collection(seconds: float) -> Any:
    started: list[float] = []

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
        elif started:
            wall, cpu = time.perf_counter() - started[0], time.thread_time() - started[1]
            if cpu >= seconds / 2:
                log.warning("garbage collection of generation %d took %.3f s (%.3f s of CPU); "
                            "%d objects collected", info["generation"], wall, cpu,
                            info["collected"])

    return on_collection
