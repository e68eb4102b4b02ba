"""The server's handle on one stage: launch, ready handshake, calls, aborts, faults, shutdown.

Every call carries the request id and a fresh dispatch token; a message from the stage whose
(rid, token) is not the pending call's is dropped (:mod:`sglang_omni.runtime.stage.calls`), so a
late, duplicated or forged result never advances a request. When the stage process dies, every
pending call fails at once with ``StageDied`` and the handle reports unhealthy. At server
shutdown ``end_calls`` fails them with the shutdown's error and aborts their jobs.

A handle runs one process at a time: ``respawn()`` starts a fresh one after a death (the
``runtime.supervisor`` decides when), so ``orchestrator.stages[name]`` stays the same object.
Each process has its own channel (:class:`~sglang_omni.runtime.stage.link.StageLink`) and exit
watch (:class:`~sglang_omni.runtime.stage.child.StageChild`), tagged with a generation number;
messages and the exit of an older process are ignored.

Everything runs on the server's event loop, with no thread between a call and the stage's
socket: ``call`` packs its header and writes it (and its frames) to the socket in the caller's
own step, and the stage's answers are read and applied by the loop's reader callback. A value
the wire cannot carry fails ``call`` at once (BadRequest naming it), and a send that fails
later fails its request at once; nothing sent is fire-and-forget.

Messages are the types of :mod:`sglang_omni.contract.messages`; what the stage sends is decoded
and dispatched by type (``_handlers``). One that fails to decode (a bug on the stage's side) is a
protocol error: the call of the job it names (by a plain ``rid`` and the call's ``token``) fails
at once with a ServerError naming the message type and field, and the job is aborted on the
stage unless the message ended it; anything else is logged and counted as dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from sglang_omni.contract.job import EngineSpec
from sglang_omni.contract.messages import (
    JOB_END_OPS,
    Abort,
    Aborted,
    Chunk,
    End,
    Error,
    Failed,
    Fatal,
    Ping,
    Pong,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Shutdown,
    Started,
    Submit,
    ToStage,
    decode_to_server,
    job_of,
)
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import BadRequest, ServerError, StageDied
from sglang_omni.runtime.ipc import (
    WireEncodeError,
    WireFrame,
    frame_size,
    pack_header,
    pack_message,
)
from sglang_omni.runtime.stage.calls import (
    CallTable,
    ChunkCallback,
    Pending,
    StageCounters,
)
from sglang_omni.runtime.stage.child import StageChild
from sglang_omni.runtime.stage.faults import StageFaults
from sglang_omni.runtime.stage.link import StageLink
from sglang_omni.runtime.stage.reports import StageReports

log = logging.getLogger("sglang_omni.runtime")

#: Seconds a cancelled call waits for the stage to end the aborted job (a native engine ends it
#: after its step in progress) before it returns anyway.
ABORT_WAIT_S = 10.0

__all__ = ["ABORT_WAIT_S", "ChunkCallback", "StageCounters", "StageHandle",
           "StageStartupError"]


class StageStartupError(Exception):
    """A stage did not become ready; the message says why and what to change."""


class _ReadyTimeout(StageStartupError):
    """The ready handshake did not come within ``startup_timeout_s``."""


class StageHandle(StageFaults):
    """Owns one stage process. Use from a single asyncio loop."""

    def __init__(self, spec: EngineSpec, startup_timeout_s: float, log_level: str = "info",
                 log_format: str = "text"):
        super().__init__()
        self.spec = spec
        self.name = spec.stage
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self.log_format = log_format
        self.ready = False
        self.exitcode: int | None = None
        #: Whether the stage's engine asked for the server to stop when this stage exits (sent
        #: with ``ready``), and the reason a ``fatal`` message gave, if any.
        self.stops_server_on_exit = False
        self.fatal_message: str | None = None
        #: The calls in flight and the jobs the process holds.
        self.calls = CallTable(self.name)
        #: What the stage's heartbeat answers report (``engine_stats``, ``media_stats``).
        self.reports = StageReports()
        self._child: StageChild | None = None
        self._link: StageLink | None = None
        self._ready_future: asyncio.Future | None = None
        #: Called when the process exits; each returns the ids of the requests it failed
        #: because of it (the orchestrator's interleaved requests), counted with the calls.
        self.death_listeners: list[Callable[[StageHandle], Iterable[str] | None]] = []
        #: Asked once when the process exits: True when the stage will be restarted (the
        #: supervisor sets it); decides what in-flight requests are told.
        self.restart_decision: Callable[[StageHandle], bool] = lambda _: False
        #: monotonic time of the last message from the current process (heartbeat answers too).
        self.last_seen = time.monotonic()
        self._generation = 0
        self._pings = itertools.count(1)
        #: When the current process was spawned, and how long after it said ready (monotonic
        #: seconds; None before): ``startup_timeout_s`` counts from the spawn.
        self._spawned_at = 0.0
        self._ready_after: float | None = None
        #: ``spawn()`` started the process ahead of ``start()``, which then only waits for it.
        self._spawned_ahead = False
        #: Called as ``listener(outcome, seconds)`` when a call ends (``completed``, ``failed``
        #: or ``aborted``): the server's stage job latency metric.
        self.job_listeners: list[Callable[[str, float], None]] = []
        #: Scratch folders being removed off the loop (``stop`` waits for them).
        self._removals: set[asyncio.Future[None]] = set()
        #: What each message from the stage does (on the loop).
        self._handlers: dict[type, Callable[[Any, Frames], None]] = {
            Pong: self._on_pong, Progress: self._on_progress, Started: self.calls.on_started,
            Chunk: self.calls.on_job_message,
            Result: self.calls.on_job_message, Error: self.calls.on_job_message,
            Aborted: self.calls.on_job_message, Ready: self._on_ready, Fatal: self._on_fatal,
            Failed: self._on_failed}

    # --- what the server reads ----------------------------------------------------------------
    @property
    def counters(self) -> StageCounters:
        return self.calls.counters

    @property
    def gpu_memory(self) -> dict[str, int] | None:
        """The device memory counters of the stage's last heartbeat answer (None without)."""
        return self.reports.gpu_memory

    @property
    def request_media(self) -> dict[str, int]:
        """What the running process keeps of its requests' media (``runtime.request_media``)."""
        return self.reports.request_media

    def engine_stats(self) -> dict[str, int]:
        """The engine's counters (its ``stats()``; empty for engines without)."""
        return self.reports.engine_stats()

    def media_stats(self) -> list[dict[str, Any]]:
        """The media counters of every process this stage ran (``MediaStats.snapshot``s)."""
        return self.reports.media_stats()

    @property
    def process_generation(self) -> int:
        """Which process of the stage runs now (1 for the first, one more per respawn): what a
        process was sent, a later one does not hold."""
        return self._generation

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child else None

    @property
    def healthy(self) -> bool:
        return self.ready and not self.dead and not self.stalled

    @property
    def process_was_ready(self) -> bool:
        """Whether the current (or last) process said it was ready: False for one that exited
        while starting."""
        return self._ready_after is not None

    @property
    def open_jobs(self) -> int:
        """Jobs the stage's process holds now: sent and not ended by it (an aborted one until
        it says so); 0 once the process is gone."""
        return 0 if self.dead else len(self.calls.open)

    @property
    def status(self) -> str:
        """``ready``, ``starting``, ``stalled``, ``restarting`` or ``exited`` (for good)."""
        if self.stalled:
            return "stalled"
        if self.restarting:
            return "restarting"
        if self.dead:
            return "exited"
        return "ready" if self.ready else "starting"

    def silent_with_jobs_s(self) -> float:
        """Seconds the stage has held a job without a sign of progress on any (0 when it holds
        none): how long an engine may have been hung (a GPU hang), while its reader thread
        still answers heartbeats. An aborted job counts until the stage says it ended."""
        return self.calls.silent_s()

    # --- start --------------------------------------------------------------------------------
    def spawn(self) -> bool:
        """Start the process now, in the running event loop, without waiting for it: the next
        ``start()`` waits for this process instead of spawning one (the server spawns its stages
        before it imports its app, so their start-up overlaps the server's). False when an
        earlier ``spawn()`` did and ``start()`` has not run since."""
        if self._spawned_ahead:
            return False
        self._spawn()
        self._spawned_ahead = True
        return True

    async def start(self) -> None:
        """Spawn the process (unless ``spawn()`` did) and wait for its ready message;
        StageStartupError on failure."""
        if self._spawned_ahead:
            self._spawned_ahead = False
        else:
            self._spawn()
        try:
            await self._await_ready()
        except _ReadyTimeout as exc:
            await self.stop()
            raise StageStartupError(str(exc)) from None

    async def respawn(self) -> None:
        """Start a fresh process after the last one exited; StageStartupError on failure."""
        if self._child is not None and self._child.is_alive():
            raise RuntimeError(f"the {self.name} stage process is still running")
        self._spawn()
        child = self._child
        try:
            await self._await_ready()
        except (StageStartupError, asyncio.CancelledError):
            if child is not None:  # make sure the failed attempt is gone
                child.kill_group()
                await child.wait(5.0)
            raise

    def _spawn(self) -> None:
        self._generation += 1
        gen = self._generation
        self.ready = False
        self.dead = False
        self.stalled = False
        self.exitcode = None
        self.fatal_message = None
        self.calls.open.clear()
        self.reports.new_process()
        if self._link is not None:
            self._link.close()
        self._remove_scratch()
        loop = asyncio.get_running_loop()
        self._ready_future = loop.create_future()
        self._spawned_at, self._ready_after = time.monotonic(), None
        self._child = StageChild(self.spec, self.log_level, self.log_format,
                                 on_exit=lambda: self._on_exit(gen))
        sock = self._child.spawn()
        self._link = StageLink(sock, lambda header, frames: self._on_message(header, frames, gen),
                               lambda: None, name=self.name,
                               on_bytes=lambda: self._on_bytes(gen))
        self.last_seen = time.monotonic()

    async def _await_ready(self) -> None:
        assert self._ready_future is not None
        # counted from the spawn (the server may spawn its stages well before it waits)
        left = self.startup_timeout_s - (time.monotonic() - self._spawned_at)
        try:
            async with asyncio.timeout(max(0.0, left)):  # a cancellation always propagates
                await asyncio.shield(self._ready_future)
            if self._ready_after is not None and self._ready_after > self.startup_timeout_s:
                raise TimeoutError
        except TimeoutError:
            raise _ReadyTimeout(
                f"the {self.name} stage did not become ready within {self.startup_timeout_s:g} s; "
                f"raise stages.{self.name}.factory.startup_timeout_s or check its log above"
            ) from None
        self.ready = True

    # --- calls --------------------------------------------------------------------------------
    async def call(self, rid: str, payload: Mapping[str, Any],
                   frames: Sequence[WireFrame] | None = None,
                   on_chunk: ChunkCallback | None = None,
                   media: Mapping[str, list[str]] | None = None,
                   order: float | None = None) -> StageResult:
        """Run ``payload`` on the stage for request ``rid``; the result names this stage.

        ``order``: the request's admission time on this process's monotonic clock (default:
        now); a generation stage runs the oldest request's job first
        (:mod:`sglang_omni.contract.gpu_turns`).

        ``media`` (``{keys, new}``, see :mod:`sglang_omni.runtime.request_media`): ``frames``
        are the request's new media items, kept by the stage for the request, and the job reads
        the items ``keys`` names. A frame may be a client's inline medium as its checked base64
        text (``InlinePayload``): the stage decodes it as it arrives (``runtime.ipc``).

        Chunks go to ``on_chunk`` in order. Cancelling the awaiting task aborts the job on the
        stage and returns once the stage says the job ended (at most :data:`ABORT_WAIT_S`; at
        once if the stage dies), so the caller's next job never overlaps it. Raises StageDied,
        StageCallError or ServerError.
        """
        if not self.healthy:
            if self.stalled:  # a request the stall fails: its exit counts it
                self._stall_failed.add(rid)
            raise self.not_running(rid)
        if self._ended_by is not None:
            raise self._ended_by(rid)
        if rid in self.calls.pending:
            raise ServerError(f"request {rid} already has a call in flight on {self.name}")
        token = self.calls.token()
        submit = Submit(rid, token, cast(dict[str, Any], payload),
                        time.monotonic() if order is None else order,
                        None if media is None else {"keys": list(media["keys"]),
                                                    "new": list(media["new"])})
        try:
            packed = pack_message(submit, frames or [])
        except WireEncodeError as exc:
            where = exc.path.removeprefix("payload.") if exc.path else "the request"
            raise BadRequest(
                f"{where}: holds {exc.detail}, which cannot be carried to the {self.name} stage; "
                "send integers within 64 bits and strings of valid Unicode") from None
        sent_bytes = packed.nbytes + sum(frame_size(frame) for frame in frames or [])
        pending = self.calls.open_call(rid, on_chunk, sent_bytes, token)
        self._send(packed, frames, lambda exc: self._submit_failed(rid, pending, exc))
        started, outcome = time.monotonic(), "failed"
        try:
            result: StageResult = await asyncio.shield(pending.future)
            outcome = "completed"
            return result
        except asyncio.CancelledError:
            outcome = "aborted"
            if not pending.future.done():
                log.info("request %s cancelled; aborting its job on the %s stage", rid, self.name)
                ended = self.calls.aborting(rid, token)
                self.abort(rid)
                await self._until_aborted(rid, token, ended)
            raise
        finally:
            self.calls.close_call(rid, pending)
            self._job_ended(outcome, time.monotonic() - started)

    async def _until_aborted(self, rid: str, token: int, ended: asyncio.Future[None]) -> None:
        """Wait (up to ABORT_WAIT_S) until the stage reports job ``token`` of ``rid`` ended;
        not at all once the calls were ended (:meth:`end_calls`): no later job follows it."""
        try:
            if self._ended_by is None:
                async with asyncio.timeout(ABORT_WAIT_S):
                    await asyncio.shield(ended)
        except TimeoutError:
            log.warning("the %s stage has not ended the aborted job of request %s after %.0f "
                        "s; going on", self.name, rid, ABORT_WAIT_S)
        finally:
            self.calls.forget_abort(rid, token)

    def _job_ended(self, outcome: str, seconds: float) -> None:
        for listener in self.job_listeners:
            try:
                listener(outcome, seconds)
            except Exception:  # noqa: BLE001 - metrics must not fail a request
                log.exception("%s: a job listener failed", self.name)

    def abort(self, rid: str) -> None:
        """Tell the stage to stop ``rid``'s job; its late messages are dropped from now on."""
        pending = self.calls.pending.pop(rid, None)
        if pending is not None and not pending.future.done():
            pending.future.cancel()
        if not self.dead:
            self._post(Abort(rid))

    def end_request(self, rid: str) -> None:
        """Tell the stage request ``rid`` ended, so it drops what it keeps for the request
        across calls (the hf Reasoner's context); nothing to send to a stage that is gone."""
        if self.ready and not self.dead:
            self._post(End(rid))

    def ping(self) -> None:
        """Send a heartbeat; the stage's reader thread answers it (``last_seen`` moves on)."""
        if self.ready and not self.dead:
            self._post(Ping(next(self._pings)))

    def _post(self, message: ToStage) -> None:
        """Send a control message (abort, end, ping, shutdown); a failure is logged (the stage
        is gone or going, and its death is handled by the exit watch)."""
        self._send(pack_header(message), None, lambda exc: log.debug(
            "%s: could not send %s (stage gone): %r", self.name, message.op, exc))

    def _send(self, packed: Any, frames: Sequence[WireFrame] | None,
              on_error: Callable[[BaseException], None]) -> None:
        link = self._link
        if link is None:  # no process (yet): nothing to send to
            log.debug("%s: no stage process; message not sent", self.name)
            return
        link.send(packed, frames, on_error)

    def _submit_failed(self, rid: str, pending: Pending, exc: BaseException) -> None:
        """The submit of ``pending`` could not be written whole: fail its request at once."""
        if pending.future.done():
            return
        log.error("%s: could not send request %s to the stage: %r", self.name, rid, exc)
        error = StageDied(f"the {self.name} stage could not be reached for request {rid} "
                          f"({exc!r}); retry shortly") \
            if isinstance(exc, (OSError, EOFError)) else \
            ServerError(f"request {rid} could not be sent to the {self.name} stage: {exc!r}")
        self.calls.fail_unsent(rid, pending, error)

    # --- receiving ----------------------------------------------------------------------------
    def _on_bytes(self, gen: int) -> None:
        """Part of a message arrived (a large result, which the stage's heartbeat answers wait
        behind): the process is alive, as an answer would say."""
        if gen == self._generation:
            self.last_seen = time.monotonic()

    def _on_message(self, header: dict[str, Any], frames: Frames, gen: int | None = None
                    ) -> None:
        """Handle a stage message (on the loop); one of an older process (``gen``) is ignored."""
        if gen is not None and gen != self._generation:
            return
        self.last_seen = time.monotonic()
        try:
            message = decode_to_server(header)
        except ProtocolError as exc:
            self._on_malformed(header, exc)
            return
        self._handlers[type(message)](message, frames)

    def _on_malformed(self, header: dict[str, Any], exc: ProtocolError) -> None:
        """A message from the stage failed to decode (a bug on the stage's side): the call of
        the job it names plainly, if any, fails with one error naming the field, and the job
        is aborted on the stage unless the message ended it; anything else (a type this server
        does not know among them: the wire grows by adding) is dropped."""
        log.error("%s: a message from the stage failed to decode: %s", self.name, exc)
        job = job_of(header)
        if job is None or exc.field == "op":
            self.counters.dropped += 1
            return
        rid, token = job
        ended = exc.message_type in JOB_END_OPS
        error = ServerError(f"the {self.name} stage answered request {rid} with a message the "
                            f"server cannot read ({exc}); report this bug")
        if not self.calls.fail_malformed(rid, token, ended, error):
            self.counters.dropped += 1
        elif not ended and not self.dead:
            self._post(Abort(rid))

    def _on_pong(self, pong: Pong, _: Frames) -> None:
        if self.reports.pong(pong):  # media arriving for its jobs is progress too
            self.calls.last_progress = self.last_seen

    def _on_progress(self, _: Progress, __: Frames) -> None:
        self.calls.last_progress = self.last_seen

    def _on_ready(self, ready: Ready, _: Frames) -> None:
        self.stops_server_on_exit = ready.stops_server_on_exit
        if self._ready_future and not self._ready_future.done():
            self._ready_after = time.monotonic() - self._spawned_at
            self._ready_future.set_result(None)

    def _on_fatal(self, fatal: Fatal, _: Frames) -> None:
        self.fatal_message = fatal.message
        log.error("the %s stage failed: %s", self.name, self.fatal_message)

    def _on_failed(self, failed: Failed, _: Frames) -> None:
        if self._ready_future and not self._ready_future.done():
            self._ready_future.set_exception(StageStartupError(
                f"the {self.name} stage failed to start: {failed.message}"))

    # --- the process --------------------------------------------------------------------------
    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill_group()

    def _kill_with_stacks(self) -> None:
        if self._child is not None:
            self._child.kill_group_after_stacks()

    def _read_left(self) -> None:
        """Handle the messages the exited process sent that are still unread."""
        if self._link is not None:
            self._link.drain()

    def _has_process(self) -> bool:
        return self._child is not None

    def _remove_scratch(self) -> None:
        """Remove the temporary-file folder of the last process, off the loop (it is gone or
        never ran)."""
        removal = self._child.remove_scratch() if self._child is not None else None
        if removal is not None:
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)

    def _exited(self) -> None:
        """The process exited: read its code, release its channel, children and folder."""
        assert self._child is not None
        self.exitcode = self._child.exitcode
        self._kill()  # its children go with it
        self._remove_scratch()  # what it left of its requests' temporary files
        if self._ready_future and not self._ready_future.done():
            self._ready_future.set_exception(StageStartupError(
                f"the {self.name} stage exited with code {self.exitcode} before it was ready; "
                "see its log above"))

    # --- shutdown -----------------------------------------------------------------------------
    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process and all its children; escalates to SIGTERM, then SIGKILL."""
        self._closing = True
        child = self._child
        if child is None:
            return
        if child.is_alive():
            self._post(Shutdown())
            await child.wait(grace_s)
        if child.is_alive():
            child.kill_group(signal.SIGTERM)
            await child.wait(3.0)
        child.kill_group()
        await child.wait(3.0)
        if not child.is_alive():
            await child.join_threads(2.0)
        self._remove_scratch()
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        if self._link is not None:
            self._link.close()
