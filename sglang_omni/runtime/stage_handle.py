"""The server's handle on one stage process: launch, ready handshake, calls, aborts, death.

Every call carries the request id and a fresh dispatch token; a message from the stage whose
(rid, token) is not the pending call's is dropped, so a late, duplicated or forged result never
advances a request. When the stage process dies, every pending call fails within about a second
with ``StageDied`` and the handle reports unhealthy. At server shutdown ``end_calls`` fails
them with the shutdown's error and aborts their jobs.

A handle runs one process at a time: ``respawn()`` starts a fresh one after a death (the
``runtime.supervisor`` decides when), so ``orchestrator.stages[name]`` stays the same object.
Each process has its own channel and threads, tagged with a generation number; messages and the
exit of an older process are ignored. Headers are packed in the caller's context, so a value
the wire cannot carry fails ``call`` at once (BadRequest naming it), and a send that fails later
fails its request at once; nothing sent is fire-and-forget.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sglang_omni.config.gpus import device_env
from sglang_omni.contract.job import CHUNK_FRAMES, EngineSpec, clean_spans
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import BadRequest, OmniError, ServerError, StageCallError, StageDied
from sglang_omni.runtime.ipc import (
    Channel,
    PackedHeader,
    WireEncodeError,
    channel_pair,
    pack_header,
)
from sglang_omni.runtime.proc import kill_led_group
from sglang_omni.runtime.stage_process import stage_main

log = logging.getLogger("sglang_omni.runtime")

#: Seconds a cancelled call waits for the stage to end the aborted job (a native engine ends it
#: after its step in progress) before it returns anyway.
ABORT_WAIT_S = 10.0

ChunkCallback = Callable[[dict[str, Any]], None]

#: The stage's messages that end a job, and those about a job (each a sign of progress).
JOB_ENDS = frozenset({"result", "error", "aborted"})
#: Engine stats (``pong.engine``) that describe the running process, not counts since it began.
ENGINE_GAUGES = frozenset({"bytes", "budget", "requests"})
JOB_OPS = JOB_ENDS | {"chunk", "progress"}


class StageStartupError(Exception):
    """A stage did not become ready; the message says why and what to change."""


class _ReadyTimeout(StageStartupError):
    """The ready handshake did not come within ``startup_timeout_s``."""


@dataclass
class _Pending:
    token: int
    future: asyncio.Future
    on_chunk: ChunkCallback | None


@dataclass
class StageCounters:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    dropped: int = 0
    #: Bytes of the jobs sent to the stage (each submit's header and frames), over every
    #: process the stage ran.
    sent_bytes: int = 0


class StageHandle:
    """Owns one stage process. Use from a single asyncio loop."""

    def __init__(self, spec: EngineSpec, startup_timeout_s: float, log_level: str = "info",
                 log_format: str = "text"):
        self.spec = spec
        self.name = spec.stage
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self.log_format = log_format
        self.ready = False
        self.dead = False
        self.exitcode: int | None = None
        #: Whether the stage's engine asked for the server to stop when this stage exits (sent
        #: with ``ready``), and the reason a ``fatal`` message gave, if any.
        self.stops_server_on_exit = False
        self.fatal_message: str | None = None
        self.counters = StageCounters()
        self._pending: dict[str, _Pending] = {}
        #: (rid, token) of aborted jobs -> set once the stage says the job ended (or dies).
        self._aborting: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._tokens = itertools.count(1)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-send")
        self._process: mp.process.BaseProcess | None = None
        self._channel: Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_future: asyncio.Future | None = None
        self._closing = False
        #: Called when the process exits; each returns the ids of the requests it failed
        #: because of it (the orchestrator's interleaved requests), counted with the calls.
        self.death_listeners: list[Callable[[StageHandle], Iterable[str] | None]] = []
        #: Requests failed by this stage's faults (exits and stalls), each counted once a fault.
        self.failed_requests = 0
        self._stall_failed: set[str] = set()  # the requests a stall failed, until its exit
        #: Asked once when the process exits: True when the stage will be restarted (the
        #: supervisor sets it); decides what in-flight requests are told.
        self.restart_decision: Callable[[StageHandle], bool] = lambda _: False
        #: The supervisor is bringing the stage back (backoff or startup of the new process).
        self.restarting = False
        #: The stage stopped answering its heartbeat; set until the process is gone.
        self.stalled = False
        #: Why the stage's last process failed (it exited, froze or its engine hung), for
        #: ``/health``; None while no process of it has failed.
        self.last_fault: str | None = None
        #: monotonic time of the last message from the current process (heartbeat answers too).
        self.last_seen = time.monotonic()
        #: Jobs (rid, token) sent to the current process that it has not ended yet (no result,
        #: error or aborted message): an aborted job stays here until the stage says it ended.
        self._open: set[tuple[str, int]] = set()
        #: monotonic time of the last sign of progress on a job (a submit to an idle stage, a
        #: chunk, result, error or aborted message): see ``silent_with_jobs_s``.
        self._last_progress = time.monotonic()
        self._generation = 0
        self._pings = itertools.count(1)
        #: The temporary-file folder of the current process (``stage_main``'s ``scratch``).
        self._scratch: str | None = None
        #: Why the last process ended, after "the STAGE stage" (its exit code, or the stall
        #: it was killed for): what requests that depended on it are told.
        self.exit_cause = ""
        self._stall_cause: str | None = None
        #: When the current process was spawned, and how long after it said ready (monotonic
        #: seconds; None before): ``startup_timeout_s`` counts from the spawn.
        self._spawned_at = 0.0
        self._ready_after: float | None = None
        #: ``spawn()`` started the process ahead of ``start()``, which then only waits for it.
        self._spawned_ahead = False
        #: Set by :meth:`end_calls` (server shutdown): the error of each call from then on.
        self._ended_by: Callable[[str], OmniError] | None = None
        #: Called as ``listener(outcome, seconds)`` when a call ends (``completed``, ``failed``
        #: or ``aborted``): the server's stage job latency metric.
        self.job_listeners: list[Callable[[str, float], None]] = []
        #: The media counters the stage sent with its last heartbeat answer, and the sum of
        #: those of its earlier processes (``media_stats()`` adds them up).
        self._media: dict[str, Any] = {}
        self._media_before: list[dict[str, Any]] = []
        #: The engine's own counters from the stage's last heartbeat answer (the hf Reasoner's
        #: context), and the counters of its earlier processes summed (``engine_stats()``).
        self._engine: dict[str, int] = {}
        self._engine_before: dict[str, int] = {}
        #: The device memory counters (``allocated``, ``reserved``, ``peak`` bytes) the stage
        #: sent with its last heartbeat answer; None for a stage that does not use CUDA itself.
        self.gpu_memory: dict[str, int] | None = None
        #: What the running process keeps of its requests' media, from its last heartbeat
        #: answer (``runtime.request_media``; empty until the first, and after it exits).
        self.request_media: dict[str, int] = {}

    def engine_stats(self) -> dict[str, int]:
        """The engine's counters (its ``stats()``; empty for engines without): the gauges
        :data:`ENGINE_GAUGES` of the running process, every other value summed over every
        process this stage ran."""
        out = dict(self._engine)
        for key, value in self._engine_before.items():
            out[key] = out.get(key, 0) + value
        return out

    def media_stats(self) -> list[dict[str, Any]]:
        """The media counters of every process this stage ran (``MediaStats.snapshot``s)."""
        return [*self._media_before, self._media]

    @property
    def process_generation(self) -> int:
        """Which process of the stage runs now (1 for the first, one more per respawn): what a
        process was sent, a later one does not hold."""
        return self._generation

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def healthy(self) -> bool:
        return self.ready and not self.dead and not self.stalled

    @property
    def open_jobs(self) -> int:
        """Jobs the stage's process holds now: sent and not ended by it (an aborted one until
        it says so); 0 once the process is gone."""
        return 0 if self.dead else len(self._open)

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

    def spawn(self) -> bool:
        """Start the process now, in the running event loop, without waiting for it: the next
        ``start()`` waits for this process instead of spawning one (the server spawns its stages
        before it imports its app, so their start-up overlaps the server's). False when an
        earlier ``spawn()`` did and ``start()`` has not run since."""
        if self._spawned_ahead:
            return False
        self._loop = asyncio.get_running_loop()
        self._spawn()
        self._spawned_ahead = True
        return True

    async def start(self) -> None:
        """Spawn the process (unless ``spawn()`` did) and wait for its ready message;
        StageStartupError on failure."""
        if self._spawned_ahead:
            self._spawned_ahead = False
        else:
            self._loop = asyncio.get_running_loop()
            self._spawn()
        try:
            await self._await_ready()
        except _ReadyTimeout as exc:
            await self.stop()
            raise StageStartupError(str(exc)) from None

    async def respawn(self) -> None:
        """Start a fresh process after the last one exited; StageStartupError on failure."""
        if self._process is not None and self._process.is_alive():
            raise RuntimeError(f"the {self.name} stage process is still running")
        if self._channel is not None:
            self._channel.close()
        self._spawn()
        proc = self._process
        try:
            await self._await_ready()
        except (StageStartupError, asyncio.CancelledError):
            if proc is not None:  # make sure the failed attempt is gone
                _kill_stage_group(proc)
                await _join(proc, 5.0)
            raise

    def _spawn(self) -> None:
        assert self._loop is not None
        self._generation += 1
        gen = self._generation
        self.ready = False
        self.dead = False
        self.stalled = False
        self.exitcode = None
        self.fatal_message = None
        self._open.clear()
        if self._media:
            self._media_before.append(self._media)
            self._media = {}
        for key, value in self._engine.items():
            if key not in ENGINE_GAUGES:
                self._engine_before[key] = self._engine_before.get(key, 0) + value
        self._engine = {}
        self.gpu_memory = None
        self.request_media = {}
        self._ready_future = self._loop.create_future()
        self._spawned_at, self._ready_after = time.monotonic(), None
        ctx = mp.get_context("spawn")
        ours, theirs = channel_pair()
        self._remove_scratch()
        self._scratch = tempfile.mkdtemp(prefix=f"sgl-omni-{self.name}-")
        self._process = ctx.Process(
            target=stage_main,
            args=(self.spec, device_env(self.spec.gpu), theirs, self.log_level,
                  self.log_format, self._scratch),
            name=f"sgl-omni-{self.name}", daemon=False,
        )
        self._process.start()
        theirs.close()
        self._channel = Channel(ours)
        self.last_seen = time.monotonic()
        threading.Thread(target=self._read_loop, args=(gen, self._channel), daemon=True,
                         name=f"{self.name}-recv").start()
        threading.Thread(target=self._watch, args=(gen, self._process), daemon=True,
                         name=f"{self.name}-watch").start()

    async def _await_ready(self) -> None:
        assert self._ready_future is not None
        # counted from the spawn (the server may spawn its stages well before it waits)
        left = self.startup_timeout_s - (time.monotonic() - self._spawned_at)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_future), max(0.0, left))
            if self._ready_after is not None and self._ready_after > self.startup_timeout_s:
                raise TimeoutError
        except TimeoutError:
            raise _ReadyTimeout(
                f"the {self.name} stage did not become ready within {self.startup_timeout_s:g} s; "
                f"raise stages.{self.name}.factory.startup_timeout_s or check its log above"
            ) from None
        self.ready = True

    # --- calls ------------------------------------------------------------------------------
    async def call(self, rid: str, payload: Mapping[str, Any], frames: Frames | None = None,
                   on_chunk: ChunkCallback | None = None,
                   media: Mapping[str, list[str]] | None = None) -> StageResult:
        """Run ``payload`` on the stage for request ``rid``; the result names this stage.

        ``media`` (``{keys, new}``, see :mod:`sglang_omni.runtime.request_media`): ``frames``
        are the request's new media items, kept by the stage for the request, and the job reads
        the items ``keys`` names.

        Chunks go to ``on_chunk`` in order. Cancelling the awaiting task aborts the job on the
        stage and returns once the stage says the job ended (at most :data:`ABORT_WAIT_S`; at
        once if the stage dies), so the caller's next job never overlaps it. Raises StageDied,
        StageCallError or ServerError.
        """
        if not self.healthy:
            if self.stalled:  # a request the stall fails: its exit counts it
                self._stall_failed.add(rid)
            raise StageDied(f"the {self.name} stage is not running ({self.status}); "
                            + ("retry shortly" if self.restarting else "the server is unhealthy"))
        if self._ended_by is not None:
            raise self._ended_by(rid)
        if rid in self._pending:
            raise ServerError(f"request {rid} already has a call in flight on {self.name}")
        token = next(self._tokens)
        header: dict[str, Any] = {"op": "submit", "rid": rid, "token": token,
                                  "payload": payload}
        if media is not None:
            header["media"] = {"keys": list(media["keys"]), "new": list(media["new"])}
        try:
            packed = pack_header(header, len(frames or []))
        except WireEncodeError as exc:
            where = exc.path.removeprefix("payload.") if exc.path else "the request"
            raise BadRequest(
                f"{where}: holds {exc.detail}, which cannot be carried to the {self.name} stage; "
                "send integers within 64 bits and strings of valid Unicode") from None
        pending = _Pending(token, asyncio.get_running_loop().create_future(), on_chunk)
        self._pending[rid] = pending
        if not self._open:  # an idle stage's silence is not a hang
            self._last_progress = time.monotonic()
        self._open.add((rid, token))
        self.counters.submitted += 1
        self.counters.sent_bytes += packed.nbytes + sum(len(frame) for frame in frames or [])
        sent = self._sender.submit(self._send_packed, packed, frames)
        sent.add_done_callback(lambda f: self._submit_sent(f, rid, pending))
        started, outcome = time.monotonic(), "failed"
        try:
            result: StageResult = await asyncio.shield(pending.future)
            outcome = "completed"
            return result
        except asyncio.CancelledError:
            outcome = "aborted"
            if not pending.future.done():
                log.info("request %s cancelled; aborting its job on the %s stage", rid, self.name)
                ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._aborting[(rid, token)] = ended
                self.abort(rid)
                await self._until_aborted(rid, token, ended)
            raise
        finally:
            if self._pending.get(rid) is pending:
                del self._pending[rid]
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
            self._aborting.pop((rid, token), None)

    def _job_ended(self, outcome: str, seconds: float) -> None:
        for listener in self.job_listeners:
            try:
                listener(outcome, seconds)
            except Exception:  # noqa: BLE001 - metrics must not fail a request
                log.exception("%s: a job listener failed", self.name)

    def abort(self, rid: str) -> None:
        """Tell the stage to stop ``rid``'s job; its late messages are dropped from now on."""
        pending = self._pending.pop(rid, None)
        if pending is not None and not pending.future.done():
            pending.future.cancel()
        if not self.dead:
            self._post({"op": "abort", "rid": rid})

    def end_request(self, rid: str) -> None:
        """Tell the stage request ``rid`` ended, so it drops what it keeps for the request
        across calls (the hf Reasoner's context); nothing to send to a stage that is gone."""
        if self.ready and not self.dead:
            self._post({"op": "end", "rid": rid})

    def ping(self) -> None:
        """Send a heartbeat; the stage's reader thread answers it (``last_seen`` moves on)."""
        if self.ready and not self.dead:
            self._post({"op": "ping", "seq": next(self._pings)})

    def _post(self, header: dict[str, Any]) -> None:
        """Queue a control message (abort, end, ping, shutdown); a failure is logged (the stage is
        gone or going, and its death is handled by the watcher)."""
        packed = pack_header(header)
        sent = self._sender.submit(self._send_packed, packed, None)
        sent.add_done_callback(lambda f: self._control_sent(f, str(header.get("op"))))

    def _send_packed(self, packed: PackedHeader, frames: Frames | None) -> None:
        channel = self._channel
        if channel is None:  # no process (yet): nothing to send to
            log.debug("%s: no stage process; message not sent", self.name)
            return
        channel.send_packed(packed, frames)

    def _control_sent(self, sent: Future, op: str) -> None:
        exc = sent.exception() if not sent.cancelled() else None
        if exc is not None:
            log.debug("%s: could not send %s (stage gone): %r", self.name, op, exc)

    def _submit_sent(self, sent: Future, rid: str, pending: _Pending) -> None:
        """Done callback of the send (on the sender thread, or the loop's when the send had
        already ended): a failed send fails the request at once."""
        exc = sent.exception() if not sent.cancelled() else RuntimeError("send cancelled")
        if exc is None:
            return
        log.error("%s: could not send request %s to the stage: %r", self.name, rid, exc)
        error = StageDied(f"the {self.name} stage could not be reached for request {rid} "
                          f"({exc!r}); retry shortly") \
            if isinstance(exc, (OSError, EOFError)) else \
            ServerError(f"request {rid} could not be sent to the {self.name} stage: {exc!r}")
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._fail_pending, rid, pending, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            return

    def _fail_pending(self, rid: str, pending: _Pending, error: OmniError) -> None:
        self._open.discard((rid, pending.token))  # never sent: the stage holds no such job
        if not pending.future.done():
            self.counters.failed += 1
            pending.future.set_exception(error)
        if self._pending.get(rid) is pending:
            del self._pending[rid]

    # --- receiving --------------------------------------------------------------------------
    def _read_loop(self, gen: int, channel: Channel) -> None:
        assert self._loop is not None
        while True:
            try:
                header, frames = channel.recv()
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - a garbled message is dropped, not fatal
                log.exception("%s: undecodable message from stage", self.name)
                continue
            if gen != self._generation:
                return
            self.last_seen = time.monotonic()
            if header.get("op") == "pong":
                media = header.get("media")
                if isinstance(media, dict):
                    if media != self._media:  # media arriving for its jobs is progress too
                        self._last_progress = self.last_seen
                    self._media = media
                gpu = header.get("gpu")
                self.gpu_memory = {str(k): int(v) for k, v in gpu.items()
                                   if isinstance(v, int) and not isinstance(v, bool)} \
                    if isinstance(gpu, dict) else None
                held = header.get("request_media")
                if isinstance(held, dict):
                    self.request_media = {str(k): int(v) for k, v in held.items()
                                          if isinstance(v, int) and not isinstance(v, bool)}
                engine = header.get("engine")
                if isinstance(engine, dict):
                    self._engine = {str(k): int(v) for k, v in engine.items()
                                    if isinstance(v, int | float) and not isinstance(v, bool)}
                continue
            if header.get("op") in JOB_OPS:  # noted here: a busy server loop is no hang
                self._last_progress = self.last_seen
                if header.get("op") == "progress":  # nothing more to do with it
                    continue
            try:
                self._loop.call_soon_threadsafe(self._on_message, header, frames, gen)
            except RuntimeError:
                return

    def _on_message(self, header: dict[str, Any], frames: Frames, gen: int | None = None
                    ) -> None:
        """Handle a stage message (on the loop); one of an older process (``gen``) is ignored."""
        if gen is not None and gen != self._generation:
            return
        op = header.get("op")
        if op == "ready":
            self.stops_server_on_exit = bool(header.get("stops_server_on_exit"))
            if self._ready_future and not self._ready_future.done():
                self._ready_after = time.monotonic() - self._spawned_at
                self._ready_future.set_result(None)
            return
        if op == "fatal":
            self.fatal_message = str(header.get("message"))
            log.error("the %s stage failed: %s", self.name, self.fatal_message)
            return
        if op == "failed":
            if self._ready_future and not self._ready_future.done():
                self._ready_future.set_exception(StageStartupError(
                    f"the {self.name} stage failed to start: {header.get('message')}"))
            return
        rid = header.get("rid")
        token = header.get("token")
        if op in JOB_ENDS and isinstance(rid, str) and isinstance(token, int):
            self._open.discard((rid, token))
            ended = self._aborting.pop((rid, token), None)
            if ended is not None and not ended.done():
                ended.set_result(None)  # an aborted job's last word, whichever it is
        if op == "aborted":
            self.counters.aborted += 1
            return
        pending = self._pending.get(rid) if isinstance(rid, str) else None
        if pending is None or header.get("token") != pending.token or pending.future.done():
            self.counters.dropped += 1
            log.debug("%s: dropped stale %s for %s", self.name, op, rid)
            return
        if op == "chunk":
            if pending.on_chunk is not None:
                data = header.get("data") or {}
                pending.on_chunk({**data, CHUNK_FRAMES: frames} if frames else data)
        elif op == "result":
            self.counters.completed += 1
            pending.future.set_result(StageResult(
                header.get("payload") or {}, frames, float(header.get("engine_s", 0.0)),
                self.name, spans=clean_spans(header.get("spans"))))
        elif op == "error":
            self.counters.failed += 1
            pending.future.set_exception(StageCallError(
                str(header.get("message")), int(header.get("status", ServerError.status)),
                str(header.get("type", ServerError.type))))
        else:
            self.counters.dropped += 1

    def _watch(self, gen: int, process: mp.process.BaseProcess) -> None:
        assert self._loop is not None
        process.join()
        try:
            self._loop.call_soon_threadsafe(self._on_exit, gen)
        except RuntimeError:
            return

    def silent_with_jobs_s(self) -> float:
        """Seconds the stage has held a job without a sign of progress on any (0 when it holds
        none): how long an engine may have been hung (a GPU hang), while its reader thread
        still answers heartbeats. An aborted job counts until the stage says it ended."""
        if not self._open:
            return 0.0
        return max(0.0, time.monotonic() - self._last_progress)

    def stall(self, silent_s: float) -> None:
        """The stage stopped answering its heartbeat: fail its in-flight requests now, then
        kill its process group (the watcher then reports the exit)."""
        self._kill_stuck(
            f"has not answered its heartbeat for {silent_s:.1f} s",
            f"stopped answering (no heartbeat for {silent_s:.1f} s; killed)",
            lambda rid: f"the {self.name} stage stopped answering (no heartbeat for "
                        f"{silent_s:.1f} s) while request {rid} was running; it is killed and "
                        "restarted if its restart budget allows")

    def hang(self, silent_s: float) -> None:
        """The stage's engine made no progress on its jobs for ``silent_s`` (its
        ``progress_timeout_s``): fail its in-flight requests now, then kill its process group,
        as for a stage that stopped answering."""
        self._kill_stuck(
            f"has made no progress on its {len(self._open)} job(s) for {silent_s:.1f} s "
            f"(stages.{self.name}.factory.progress_timeout_s; a hung engine or GPU)",
            f"made no progress for {silent_s:.1f} s (its engine is hung; killed)",
            lambda rid: f"the {self.name} stage made no progress for {silent_s:.1f} s (its "
                        f"engine is hung) while request {rid} was running; it is killed and "
                        "restarted if its restart budget allows (raise "
                        f"stages.{self.name}.factory.progress_timeout_s if its generations "
                        "legitimately run longer without reporting a step)")

    def _kill_stuck(self, what: str, cause: str, message: Callable[[str], str]) -> None:
        """Fail the calls in flight with ``message(rid)`` and kill the process; ``cause`` (what
        the stage did, after "the STAGE stage") becomes its :attr:`exit_cause` when it exits."""
        if self.dead or self.stalled or self._process is None:
            return
        self.stalled = True
        self._stall_cause = cause
        self.last_fault = f"stalled: it {what}; killed"
        log.error("the %s stage %s; failing its %d call(s) in flight and killing it (its exit "
                  "counts every request it fails)", self.name, what, len(self._pending))
        self._stall_failed = set(self._fail_all(message))
        _kill_stage_group(self._process)

    def end_calls(self, error_of: Callable[[str], OmniError]) -> int:
        """Server shutdown: fail every call in flight with ``error_of(rid)`` and abort its job
        on the stage; later calls fail with it at once, and a cancelled call no longer waits
        for the stage to end its job (the stage is stopped next). Returns the calls ended."""
        self._ended_by = error_of
        aborted = self._fail_calls(error_of)
        self._end_aborting()
        if not self.dead:
            for rid in aborted:
                self._post({"op": "abort", "rid": rid})
        return len(aborted)

    def _fail_all(self, message: Callable[[str], str]) -> list[str]:
        """Fail every pending call with StageDied(``message(rid)``); their rids."""
        failed = self._fail_calls(lambda rid: StageDied(message(rid)))
        self._end_aborting()
        return failed

    def _fail_calls(self, error_of: Callable[[str], OmniError]) -> list[str]:
        """Fail every pending call with ``error_of(rid)``; the rids of those failed."""
        failed = [rid for rid, pending in self._pending.items() if not pending.future.done()]
        for rid in failed:
            self._pending[rid].future.set_exception(error_of(rid))
        self._pending.clear()
        return failed

    def _end_aborting(self) -> None:
        """A dead or stalled stage ends no more jobs: release every wait for an abort."""
        for ended in self._aborting.values():
            if not ended.done():
                ended.set_result(None)
        self._aborting.clear()

    def _on_exit(self, gen: int) -> None:
        if gen != self._generation:
            return
        assert self._process is not None
        self.exitcode = self._process.exitcode
        self.dead = True
        self.request_media = {}  # the process's memory is gone
        self._end_aborting()
        self.ready = False
        _kill_stage_group(self._process)  # its children go with it
        self._remove_scratch()  # what it left of its requests' temporary files
        if self._ready_future and not self._ready_future.done():
            self._ready_future.set_exception(StageStartupError(
                f"the {self.name} stage exited with code {self.exitcode} before it was ready; "
                "see its log above"))
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

    def _remove_scratch(self) -> None:
        """Remove the temporary-file folder of the last process (it is gone or never ran)."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    # --- shutdown ---------------------------------------------------------------------------
    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process and all its children; escalates to SIGTERM, then SIGKILL."""
        self._closing = True
        proc = self._process
        if proc is None:
            return
        if proc.is_alive():
            self._post({"op": "shutdown"})
            await _join(proc, grace_s)
        if proc.is_alive():
            _kill_stage_group(proc, signal.SIGTERM)
            await _join(proc, 3.0)
        _kill_stage_group(proc)
        await _join(proc, 3.0)
        self._remove_scratch()
        self._sender.shutdown(wait=False)
        if self._channel is not None:
            self._channel.close()


def _kill_stage_group(proc: mp.process.BaseProcess, sig: int = signal.SIGKILL) -> None:
    """Signal a stage process and the children left in its group (``exitcode`` reaps it)."""
    kill_led_group(proc.pid, proc.exitcode is not None, sig)


async def _join(proc: mp.process.BaseProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
