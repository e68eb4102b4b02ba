"""The faults of a stage and what its requests are told: an exit, a stall, a hang, shutdown.

``StageFaults`` is the part of :class:`~sglang_omni.runtime.stage.handle.StageHandle` that ends
calls because of the stage's process:

* ``stall(silent_s)`` (no heartbeat answered for the stall timeout) and ``hang(silent_s)`` (no
  progress on its jobs for the progress timeout), both called by the supervisor, fail the calls
  in flight at once with an error naming the stage and what stalled, then kill its process group
  (after asking the process to write its threads' stacks to the log: where it was stuck);
  the exit that follows names the stall as its :attr:`exit_cause`, not the kill's exit code.
* ``_on_exit(gen)`` (the process exited, on the loop): every call in flight fails with
  ``StageDied`` saying whether the stage is restarting, the death listeners are told, and each
  request failed by the fault is counted once in :attr:`failed_requests`.
* ``not_running(rid)``: the error of a call the stage cannot take now, saying why.
* ``end_calls(error_of)`` (server shutdown): fail every call with ``error_of(rid)``, abort its
  job on the stage, and fail every later call with it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sglang_omni.contract.messages import Abort, ToStage
from sglang_omni.errors import OmniError, StageDied

if TYPE_CHECKING:
    from sglang_omni.runtime.stage.calls import CallTable
    from sglang_omni.runtime.stage.reports import StageReports

log = logging.getLogger("sglang_omni.runtime")


class StageFaults:
    """Fault handling of a stage handle (a mixin: the handle provides the process side)."""

    name: str
    ready: bool
    exitcode: int | None
    fatal_message: str | None
    calls: CallTable
    reports: StageReports
    death_listeners: list[Callable[[Any], Iterable[str] | None]]
    restart_decision: Callable[[Any], bool]
    _generation: int

    def __init__(self) -> None:
        self.dead = False
        #: The stage stopped answering its heartbeat; set until the process is gone.
        self.stalled = False
        #: The supervisor is bringing the stage back (backoff or startup of the new process).
        self.restarting = False
        #: Why the stage's last process failed (it exited, froze or its engine hung), for
        #: ``/health``; None while no process of it has failed.
        self.last_fault: str | None = None
        #: Requests failed by this stage's faults (exits and stalls), each counted once a fault.
        self.failed_requests = 0
        self._stall_failed: set[str] = set()  # the requests a stall failed, until its exit
        #: Why the last process ended, after "the STAGE stage" (its exit code, or the stall
        #: it was killed for): what requests that depended on it are told.
        self.exit_cause = ""
        self._stall_cause: str | None = None
        #: Set by :meth:`end_calls` (server shutdown): the error of each call from then on.
        self._ended_by: Callable[[str], OmniError] | None = None
        self._closing = False

    # what the handle provides: post a message to the stage, kill its process, read what it
    # sent before it exited, take its exit, and whether a process is running
    _post: Callable[[ToStage], None]
    _read_left: Callable[[], None]
    _kill: Callable[[], None]
    #: kill, after asking the process to log its threads' stacks (where it was when stuck)
    _kill_with_stacks: Callable[[], None]
    _exited: Callable[[], None]
    _has_process: Callable[[], bool]

    # --- stalls ---------------------------------------------------------------------------------
    def stall(self, silent_s: float) -> None:
        """The stage stopped answering its heartbeat: fail its in-flight requests now, then
        kill its process group (the exit watch then reports the exit)."""
        self._kill_stuck(
            f"has not answered its heartbeat for {silent_s:.1f} s",
            f"stopped answering (no heartbeat for {silent_s:.1f} s; killed)",
            lambda rid: f"the {self.name} stage stopped answering (no heartbeat for "
                        f"{silent_s:.1f} s) while request {rid} was running; it is killed and "
                        "restarted (at once, or once its restart budget allows)")

    def hang(self, silent_s: float) -> None:
        """The stage's engine made no progress on its jobs for ``silent_s`` (its
        ``progress_timeout_s``): fail its in-flight requests now, then kill its process group,
        as for a stage that stopped answering. Both what the running calls are told and the exit
        cause (what requests depending on the stage are told) say which option to raise."""
        hint = (f"raise stages.{self.name}.factory.progress_timeout_s if its generations "
                "legitimately run longer without reporting a step")
        self._kill_stuck(
            f"has made no progress on its {len(self.calls.open)} job(s) for {silent_s:.1f} s "
            f"(stages.{self.name}.factory.progress_timeout_s; a hung engine or GPU)",
            f"made no progress for {silent_s:.1f} s (its engine is hung; killed; {hint})",
            lambda rid: f"the {self.name} stage made no progress for {silent_s:.1f} s (its "
                        f"engine is hung) while request {rid} was running; it is killed and "
                        f"restarted (at once, or once its restart budget allows) ({hint})")

    def _kill_stuck(self, what: str, cause: str, message: Callable[[str], str]) -> None:
        """Fail the calls in flight with ``message(rid)`` and kill the process; ``cause`` (what
        the stage did, after "the STAGE stage") becomes its :attr:`exit_cause` when it exits."""
        if self.dead or self.stalled or not self._has_process():
            return
        self.stalled = True
        self._stall_cause = cause
        self.last_fault = f"stalled: it {what}; killed"
        log.error("the %s stage %s; failing its %d call(s) in flight and killing it once it "
                  "has written its threads' stacks below (a frozen process writes none); its "
                  "exit counts every request it fails", self.name, what, len(self.calls.pending))
        self._stall_failed = set(self._fail_all(message))
        self._kill_with_stacks()

    def not_running(self, rid: str) -> StageDied:
        """What a call for ``rid`` is told when the stage cannot take it now: what actually
        happened to the stage (it stalled and is being killed and restarted, it is restarting or
        still starting), and "the server is unhealthy" only for a stage that is down for good (a
        stalled stage came back 2.8 s later, while its waiting requests had been told the server
        was unhealthy)."""
        if self.stalled:
            cause = self._stall_cause or "stopped answering"
            return StageDied(f"the {self.name} stage {cause} before request {rid} could run on "
                             "it; it is restarted if its restart budget allows: retry shortly")
        if self.restarting:
            return StageDied(f"the {self.name} stage is restarting after a fault (request "
                             f"{rid} could not run on it); retry shortly")
        if not self.dead:
            return StageDied(f"the {self.name} stage is still starting (request {rid} could not "
                             "run on it); retry when GET /health answers ok")
        return StageDied(f"the {self.name} stage is not running ({self.last_fault or 'exited'}) "
                         "and is not restarted; the server is unhealthy and needs a restart")

    # --- shutdown -------------------------------------------------------------------------------
    def end_calls(self, error_of: Callable[[str], OmniError]) -> int:
        """Server shutdown: fail every call in flight with ``error_of(rid)`` and abort its job
        on the stage; later calls fail with it at once, and a cancelled call no longer waits
        for the stage to end its job (the stage is stopped next). Returns the calls ended."""
        self._ended_by = error_of
        aborted = self.calls.fail_all(error_of)
        self.calls.end_aborting()
        if not self.dead:
            for rid in aborted:
                self._post(Abort(rid))
        return len(aborted)

    def _fail_all(self, message: Callable[[str], str]) -> list[str]:
        """Fail every pending call with StageDied(``message(rid)``); their rids."""
        failed = self.calls.fail_all(lambda rid: StageDied(message(rid)))
        self.calls.end_aborting()
        return failed

    # --- exits ----------------------------------------------------------------------------------
    def _on_exit(self, gen: int) -> None:
        """Process ``gen`` exited (on the loop); an older process's exit is ignored."""
        if gen != self._generation:
            return
        self._read_left()  # its last words (why it failed to start, a fatal error) come first
        self.dead = True
        self.ready = False
        self.reports.request_media = {}  # the process's memory is gone
        self.calls.end_aborting()
        self._exited()
        if self._closing:
            self.stalled = False
            return
        self.restarting = self.restart_decision(self)
        self.exit_cause = self._stall_cause if self.stalled and self._stall_cause else \
            f"process exited (code {self.exitcode})"
        self._stall_cause = None
        if not self.stalled:  # a stalled stage's exit is the kill; its fault is the stall
            self.last_fault = f"exited with code {self.exitcode}" + (
                f": {self.fatal_message}" if self.fatal_message else "")
        self.stalled = False
        why = f"code {self.exitcode}" if self.fatal_message is None \
            else f"code {self.exitcode}: {self.fatal_message}"
        after = "it is restarting; retry shortly" if self.restarting \
            else "the server is unhealthy and needs a restart"
        failed = self._stall_failed | set(self._fail_all(
            lambda rid: f"the {self.name} stage process exited ({why}) while request {rid} "
                        f"was running; {after}"))
        self._stall_failed = set()
        for listener in self.death_listeners:
            try:
                failed.update(listener(self) or ())
            except Exception:  # noqa: BLE001 - one listener's bug must not stop the others
                log.exception("%s: a stage death listener failed", self.name)
        self.failed_requests += len(failed)
        log.error("the %s stage process exited with code %s; %d request(s) in flight failed "
                  "with it%s", self.name, self.exitcode, len(failed),
                  "; restarting it" if self.restarting else "")
