"""Stage supervision: restart a stage process that exits, and notice one that freezes.

A ``StageSupervisor`` owns the restart policy of one ``StageHandle``. When the stage's process
exits (OOM kill, crash, kill -9) it is started again after a backoff that doubles with each
restart in the window, up to ``max_restarts`` per ``restart_window_s``; past that budget the
stage stays down and the server unhealthy. A stage whose engine stops the server on exit
(native SGLang) is never restarted. A heartbeat every ``heartbeat_interval_s`` checks that the
stage answers; one silent for ``stall_timeout_s`` is reported ``stalled``, its in-flight
requests fail, and its process group is killed, after which it restarts like a crashed stage.
A stage whose reader thread still answers but whose engine made no progress on the jobs it holds
(no step, token, result or error) for ``progress_timeout_s`` is hung (a GPU hang, a deadlocked
engine) and is handled the same way (0: never).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from sglang_omni.runtime.stage_handle import StageHandle, StageStartupError
from sglang_omni.runtime.task_errors import log_failure

log = logging.getLogger("sglang_omni.runtime")

MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class RestartPolicy:
    """The supervision options of a stage (its process factory options)."""

    max_restarts: int = 3
    restart_window_s: float = 600.0
    restart_backoff_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 30.0
    progress_timeout_s: float = 0.0

    @classmethod
    def from_factory(cls, factory: dict[str, Any]) -> RestartPolicy:
        d = cls()
        return cls(
            max_restarts=int(factory.get("max_restarts", d.max_restarts)),
            restart_window_s=float(factory.get("restart_window_s", d.restart_window_s)),
            restart_backoff_s=float(factory.get("restart_backoff_s", d.restart_backoff_s)),
            heartbeat_interval_s=float(factory.get("heartbeat_interval_s",
                                                   d.heartbeat_interval_s)),
            stall_timeout_s=float(factory.get("stall_timeout_s", d.stall_timeout_s)),
            progress_timeout_s=float(factory.get("progress_timeout_s",
                                                 d.progress_timeout_s)),
        )


class StageSupervisor:
    """Restarts and watches one stage; ``start()`` after the stage is ready, ``stop()`` before
    the stage is stopped. Use from the server's event loop."""

    def __init__(self, handle: StageHandle, policy: RestartPolicy) -> None:
        self.handle = handle
        self.policy = policy
        #: Restarts attempted since the server started (the ``/metrics`` counter).
        self.restarts = 0
        self._recent: deque[float] = deque()
        self._restart_task: asyncio.Task | None = None
        self._heartbeat_task: asyncio.Task | None = None
        self._unanswered_since: float | None = None
        self._stopping = False
        handle.restart_decision = self._decide

    def start(self) -> None:
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
        """Called when the stage's process exited: True when it will be restarted."""
        if self._stopping:
            return False
        if self._restart_task is not None and not self._restart_task.done():
            return True  # a restart attempt died while starting; the restart loop goes on
        if handle.stops_server_on_exit:
            return False
        if not self._budget_left():
            self._give_up()
            return False
        self._restart_task = asyncio.get_running_loop().create_task(
            self._restart(), name=f"{handle.name}-restart")
        self._restart_task.add_done_callback(
            log_failure(log, f"the {self.handle.name} stage's restart task"))
        return True

    def _budget_left(self) -> bool:
        now = time.monotonic()
        while self._recent and now - self._recent[0] > self.policy.restart_window_s:
            self._recent.popleft()
        return len(self._recent) < self.policy.max_restarts

    def _give_up(self) -> None:
        log.error("the %s stage exited %d time(s) within stages.%s.factory.restart_window_s "
                  "(%g s), its max_restarts; it stays down and the server unhealthy until it "
                  "is restarted by hand", self.handle.name, len(self._recent) + 1,
                  self.handle.name, self.policy.restart_window_s)

    async def _restart(self) -> None:
        """Back off, start a new process; repeat while the budget allows."""
        handle = self.handle
        while True:
            backoff = min(MAX_BACKOFF_S,
                          self.policy.restart_backoff_s * 2 ** len(self._recent))
            self._recent.append(time.monotonic())
            self.restarts += 1
            log.warning("restarting the %s stage in %.2f s (restart %d; %d of %d in the last "
                        "%g s)", handle.name, backoff, self.restarts, len(self._recent),
                        self.policy.max_restarts, self.policy.restart_window_s)
            await asyncio.sleep(backoff)
            try:
                await handle.respawn()
            except StageStartupError as exc:
                log.error("restarting the %s stage failed: %s", handle.name, exc)
                if self._stopping:
                    return
                if self._budget_left():
                    continue
                self._give_up()
                handle.restarting = False
                return
            handle.restarting = False
            self._unanswered_since = None
            log.warning("the %s stage is back (pid %s) after restart %d", handle.name,
                        handle.pid, self.restarts)
            return

    # --- heartbeat ---------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        """Ping the stage; a stage whose oldest unanswered ping is older than the stall
        timeout is stalled (a server loop that was busy sends no ping, so it cannot mistake
        its own delay for the stage's); one silent on its jobs past the progress timeout is
        hung (the stage's messages are timed by the handle's reader thread, so a busy server
        loop cannot mistake its own delay for that either)."""
        handle = self.handle
        while True:
            await asyncio.sleep(self.policy.heartbeat_interval_s)
            if not handle.healthy:
                self._unanswered_since = None
                continue
            limit = self.policy.progress_timeout_s
            if limit > 0 and (quiet := handle.silent_with_jobs_s()) > limit:
                self._unanswered_since = None
                handle.hang(quiet)
                continue
            now = time.monotonic()
            if self._unanswered_since is not None and handle.last_seen >= self._unanswered_since:
                self._unanswered_since = None
            if self._unanswered_since is not None:
                silent = now - self._unanswered_since
                if silent > self.policy.stall_timeout_s:
                    self._unanswered_since = None
                    handle.stall(silent)
                    continue
            else:
                self._unanswered_since = now
            handle.ping()

