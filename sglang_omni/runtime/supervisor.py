"""Stage supervision: restart a stage process that exits, and notice one that freezes or hangs.

A ``StageSupervisor`` owns the restart policy of one ``StageHandle``. When the stage's process
exits (OOM kill, crash, kill -9, or the kill of a stalled or hung stage) it is started again:

* at most ``max_restarts`` restarts start within any ``restart_window_s`` (a sliding window of
  the times restarts started, a failed start included);
* each restart waits a backoff of ``restart_backoff_s`` doubled for each restart already in the
  window (at most :data:`MAX_BACKOFF_S`);
* with the budget spent, the stage cools down: it is restarted as soon as the oldest restart
  in the window is ``restart_window_s`` old (then with its backoff), never given up for good.
  Meanwhile it is ``restarting`` (``/health`` 503 with Retry-After, requests 503 "restarting"),
  and those answers' ``Retry-After`` is the wait until the restart (:meth:`restart_in_s`,
  ``/health``'s ``restart_in_s``), not the server's fixed ``retry_after_s``.

So a burst of faults costs at most a window's wait and the server recovers by itself; only
``max_restarts: 0`` (never restart) leaves a stage down until the server is restarted by hand.
A stage whose engine stops the server on exit (native SGLang) is never restarted.

Liveness is judged from two signs, each with its own limit:

* the process: a heartbeat every ``heartbeat_interval_s``, answered by the stage's reader
  thread; a stage that answers none for ``stall_timeout_s`` (3 s: a frozen process, SIGSTOP,
  is found within about 5 s) is stalled;
* the engine: a stage holding a job whose engine shows no progress on any (no step, token
  batch, model call's return, chunk, result or error: ``Job.progress``; nor media bytes
  received, which the stage's heartbeat answers carry) for
  ``progress_timeout_s`` is hung (a GPU hang, a deadlocked engine), although its process still
  answers. Its default depends on the backend (:func:`default_progress_timeout_s`).

Either way its in-flight requests fail at once with an error naming the stage and what stalled,
``/health`` says ``stalled``, and its process group is killed, after which it restarts like a
crashed stage. Both limits are checked every :data:`CHECK_EVERY_S` at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sglang_omni.config.schema import PROCESS_FACTORY
from sglang_omni.runtime.stage.handle import StageHandle, StageStartupError
from sglang_omni.runtime.task_errors import log_failure

log = logging.getLogger("sglang_omni.runtime")

MAX_BACKOFF_S = 60.0
#: The liveness checks run at least this often (heartbeats go out every heartbeat_interval_s).
CHECK_EVERY_S = 0.25
#: A check that comes this much later than planned is skipped: the server's event loop was held
#: up, so the stage's answers waiting on its socket may not have been read yet (the loop reads
#: them, in the same turn as a check that is due, before it); the next check judges.
LATE_TICK_S = 0.5
#: ``progress_timeout_s`` when a stage's config leaves it unset, by backend. Every engine of
#: the scripted and hf backends reports progress at least every denoising step or decoded token
#: (a 720p native step takes 0.66 s on an H200: 60 s is about 90 silent steps).
PROGRESS_TIMEOUT_S = 60.0
#: Native generation reports its steps only through the cancellation plugin; without it a
#: whole generation is silent, so only a generation longer than this is taken for hung.
NATIVE_SILENT_GENERATION_TIMEOUT_S = 600.0


def default_progress_timeout_s(backend: str, role: str, factory: dict[str, Any]) -> float:
    """The progress timeout of a stage whose config leaves ``progress_timeout_s`` unset (0:
    never). The native Reasoner's non-streamed turn reports nothing until it ends, and native
    SGLang's own watchdog guards its forward passes, so it is not judged by progress."""
    if backend != "native":
        return PROGRESS_TIMEOUT_S
    if role == "reasoner":
        return 0.0
    if factory.get("cancellation_plugin", True):
        return PROGRESS_TIMEOUT_S
    return NATIVE_SILENT_GENERATION_TIMEOUT_S


def _default(name: str) -> Any:
    """A supervision option's default: the stage factory schema's (its one home)."""
    return PROCESS_FACTORY[name].default


@dataclass(frozen=True)
class RestartPolicy:
    """The supervision options of a stage (its process factory options); the defaults are
    the factory schema's (``config.schema.PROCESS_FACTORY``)."""

    max_restarts: int = _default("max_restarts")
    restart_window_s: float = _default("restart_window_s")
    restart_backoff_s: float = _default("restart_backoff_s")
    heartbeat_interval_s: float = _default("heartbeat_interval_s")
    stall_timeout_s: float = _default("stall_timeout_s")
    progress_timeout_s: float = PROGRESS_TIMEOUT_S

    @classmethod
    def from_factory(cls, factory: dict[str, Any], role: str = "generation") -> RestartPolicy:
        """The policy of a stage of ``role`` from its factory options; an unset (None)
        ``progress_timeout_s`` takes its backend's default."""
        d = cls()
        progress = factory.get("progress_timeout_s")
        if progress is None:
            progress = default_progress_timeout_s(str(factory.get("backend", "native")), role,
                                                  factory)
        return cls(
            max_restarts=int(factory.get("max_restarts", d.max_restarts)),
            restart_window_s=float(factory.get("restart_window_s", d.restart_window_s)),
            restart_backoff_s=float(factory.get("restart_backoff_s", d.restart_backoff_s)),
            heartbeat_interval_s=float(factory.get("heartbeat_interval_s",
                                                   d.heartbeat_interval_s)),
            stall_timeout_s=float(factory.get("stall_timeout_s", d.stall_timeout_s)),
            progress_timeout_s=float(progress),
        )


class StageSupervisor:
    """Restarts and watches one stage; ``start()`` after the stage is ready, ``stop()`` before
    the stage is stopped. Use from the server's event loop."""

    def __init__(self, handle: StageHandle, policy: RestartPolicy, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.handle = handle
        self.policy = policy
        #: The heartbeat's clock and sleep (injectable: the tests hold its loop up).
        self._clock, self._sleep = clock, sleep
        #: Restarts attempted since the server started (the ``/metrics`` counter).
        self.restarts = 0
        self._recent: deque[float] = deque()
        self._restart_task: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._unanswered_since: float | None = None
        self._stopping = False
        #: Set by ``start()`` (every stage was ready): before it, a process that exits without
        #: having been ready is the server's failed start, never restarted.
        self._started = False
        #: When (monotonic) the planned restart's new process starts: the end of the cool-down
        #: or of the backoff being waited now; None while no restart is waiting.
        self._restart_at: float | None = None
        handle.restart_decision = self._decide

    def start(self) -> None:
        self._started = True
        self._heartbeat_task = asyncio.get_running_loop().create_task(
            self._heartbeat(), name=f"{self.handle.name}-heartbeat")
        self._heartbeat_task.add_done_callback(
            log_failure(log, f"the {self.handle.name} stage's heartbeat task"))

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (self._restart_task, self._heartbeat_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- restarts ----------------------------------------------------------------------------
    def _decide(self, handle: StageHandle) -> bool:
        """Called when the stage's process exited: True when it will be restarted (at once
        or after a cool-down; only ``max_restarts: 0`` says no, and the server's own start: a
        process that exits before it was ever ready then fails the start instead)."""
        if self._stopping:
            return False
        if self._restart_task is not None and not self._restart_task.done():
            return True  # a restart attempt died while starting; the restart loop goes on
        if not self._started and not handle.process_was_ready:
            return False  # the server's own start failed: it reports why and exits
        if handle.stops_server_on_exit:
            return False
        if self.policy.max_restarts <= 0:
            log.error("the %s stage exited and stages.%s.factory.max_restarts is 0: it stays "
                      "down and the server unhealthy until it is restarted by hand",
                      handle.name, handle.name)
            return False
        self._restart_task = asyncio.get_running_loop().create_task(
            self._restart(), name=f"{handle.name}-restart")
        self._restart_task.add_done_callback(
            log_failure(log, f"the {self.handle.name} stage's restart task"))
        return True

    def _in_window(self, now: float) -> int:
        """The restarts started within ``restart_window_s`` of ``now`` (older ones dropped)."""
        while self._recent and now - self._recent[0] >= self.policy.restart_window_s:
            self._recent.popleft()
        return len(self._recent)

    def cool_down_s(self, now: float | None = None) -> float:
        """Seconds until the budget allows a restart (0: now): until the restart that fills
        the budget is ``restart_window_s`` old."""
        now = time.monotonic() if now is None else now
        over = self._in_window(now) - self.policy.max_restarts
        if over < 0:
            return 0.0
        return max(0.0, self._recent[over] + self.policy.restart_window_s - now)

    def restart_in_s(self) -> float | None:
        """Seconds until the planned restart starts the stage's new process (0 while it is
        starting); None while the stage is not restarting. ``/health`` reports it and a 503
        during the wait tells the client to retry after it (``Retry-After``)."""
        if not self.handle.restarting:
            return None
        if self._restart_at is None:
            return 0.0
        return max(0.0, self._restart_at - time.monotonic())

    async def _restart(self) -> None:
        """Wait out the cool-down and the backoff, start a new process; repeat until one
        starts (or the server stops)."""
        handle = self.handle
        while True:
            wait = self.cool_down_s()
            if wait > 0:
                log.error("the %s stage's restart budget is spent (%d restarts within "
                          "stages.%s.factory.restart_window_s, %g s: its max_restarts); it "
                          "stays down for %.1f s, until the oldest is out of the window, "
                          "then restarts", handle.name, len(self._recent), handle.name,
                          self.policy.restart_window_s, wait)
                self._restart_at = time.monotonic() + wait
                await asyncio.sleep(wait)
                continue  # the window moved: count again
            backoff = min(MAX_BACKOFF_S,
                          self.policy.restart_backoff_s * 2 ** self._in_window(time.monotonic()))
            self._recent.append(time.monotonic())
            self.restarts += 1
            log.warning("restarting the %s stage in %.2f s (restart %d; %d of %d in the last "
                        "%g s)", handle.name, backoff, self.restarts, len(self._recent),
                        self.policy.max_restarts, self.policy.restart_window_s)
            self._restart_at = time.monotonic() + backoff
            await asyncio.sleep(backoff)
            self._restart_at = None
            try:
                await handle.respawn()
            except StageStartupError as exc:
                log.error("restarting the %s stage failed: %s", handle.name, exc)
                if self._stopping:
                    return
                continue
            handle.restarting = False
            self._unanswered_since = None
            log.warning("the %s stage is back (pid %s) after restart %d", handle.name,
                        handle.pid, self.restarts)
            return

    # --- heartbeat ---------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        """Ping the stage every heartbeat interval and check it every CHECK_EVERY_S: a stage
        whose oldest unanswered ping is older than the stall timeout is stalled; one silent on
        its jobs past the progress timeout is hung. A check that comes late judges nothing (the
        server's loop was held up: the stage's answers may not be read yet, so its own delay is
        not taken for the stage's), but its ping still goes out: a server whose loop is slow
        (a loaded machine) is not a frozen server, and a stage that hears no ping for
        ``stage.process.MIN_SERVER_SILENCE_S`` exits."""
        handle = self.handle
        interval = self.policy.heartbeat_interval_s
        tick = min(interval, CHECK_EVERY_S)
        next_ping = 0.0
        last_tick = self._clock()
        while True:
            await self._sleep(tick)
            now = self._clock()
            late = now - last_tick > tick + LATE_TICK_S
            last_tick = now
            if not handle.healthy:
                self._unanswered_since = None
                continue
            if self._unanswered_since is not None and handle.last_seen >= self._unanswered_since:
                self._unanswered_since = None
            if not late and self._judged(now):
                continue
            if now < next_ping:
                continue
            if self._unanswered_since is None:
                self._unanswered_since = now
            next_ping = now + interval
            handle.ping()

    def _judged(self, now: float) -> bool:
        """Whether the stage was found hung or stalled at ``now`` (and is being killed)."""
        handle = self.handle
        limit = self.policy.progress_timeout_s
        if limit > 0 and (quiet := handle.silent_with_jobs_s()) > limit:
            self._unanswered_since = None
            handle.hang(quiet)
            return True
        if self._unanswered_since is not None:
            silent = now - self._unanswered_since
            if silent > self.policy.stall_timeout_s:
                self._unanswered_since = None
                handle.stall(silent)
                return True
        return False
