"""The entry point of a stage process: build the engine, say ready, serve jobs until told to stop.

Protocol (the types of :mod:`sglang_omni.contract.messages`, over ``ipc.Channel``; what the
server sends is dispatched by type), server -> stage: ``submit {rid, token, payload, order?}`` +
frames (``order``: the request's admission time on the server's monotonic clock; a generation
stage runs its jobs in GPU turns, the oldest request's first, pausing a younger job at a
denoising step boundary: :mod:`sglang_omni.contract.gpu_turns`; absent: the time it arrived),
``abort {rid}``, ``end {rid}`` (the request ended: an engine that keeps per-request state, such
as the hf Reasoner's context, releases it; an abort releases it too), ``shutdown``,
``ping {seq}`` (answered ``pong {seq, media, engine, request_media, gpu}`` by the reader
thread, so a frozen stage is noticed; the reader thread also sends ``pong {seq: null, ...}``
every ``ipc.KEEPALIVE_S`` while a long message, a request's media, is arriving, since the
server's ping waits behind it, and counts the message's bytes as the server's heartbeat;
``media`` is the stage's media counters (a generation stage adds its turns' ``preemptions``,
``paused`` and ``paused_bytes`` to ``engine``),
:mod:`sglang_omni.media.stats`, ``engine`` the engine's own counters when it has ``stats()``,
else absent, ``request_media`` what the stage keeps of its requests' media:
:mod:`sglang_omni.runtime.request_media`, ``gpu`` the device's memory counters where torch uses
CUDA in this process, ``memory_faults.device_memory``). A ``submit`` may carry
``media {keys, new}``: its frames are new media items of the request, kept until the request's
``end`` or ``abort`` (see :mod:`sglang_omni.runtime.request_media`).
An engine error that is an allocation failure (``memory_faults``) fails its request with
``OutOfGPUMemory`` and frees the memory; any other engine error fails its request with a 500.
Stage -> server: ``ready {pid, stops_server_on_exit}``,
``failed {message}``, ``started {rid, token}`` (the engine took the job: on a generation
stage once its GPU turn came; the server counts it, ``sgl_omni_stage_jobs_total``),
``chunk {rid, token, data}``,
``result {rid, token, payload, engine_s, spans}`` + frames, ``error {rid, token, status, type,
message}``, ``aborted {rid, token}``, ``progress {rid, token}`` (the engine's ``job.progress()``,
at most one per job every :data:`PROGRESS_EVERY_S`; the server's liveness check reads it), and
``fatal {message}`` when the engine's ``watch()`` reports it can no longer serve (the stage
then exits with code 3). A message is packed by the code that sends it, so a result or chunk
the wire cannot carry fails that request (``error``) instead of vanishing. A message from the
server that fails to decode is logged as a protocol error; a ``submit`` that still names its
``rid`` and ``token`` is answered ``error`` (500) naming the field, and the stage serves on.

The stage leads its own process group, so the server can take down the stage and every child it
started with one signal, and it dies with the server (PR_SET_PDEATHSIG). Once the server's
heartbeats have begun, a stage that hears none for :data:`SERVER_SILENCE_FACTOR` times its
``stall_timeout_s`` (at least :data:`MIN_SERVER_SILENCE_S`) takes its group down too: its
server is frozen (a stopped process, a Ray replica given up on), and the stage's GPUs must not
stay held by a server that never comes back. Once ready, the stage writes every thread's stack to
its log on :data:`STACKS_SIGNAL` (the server sends it before it kills a stalled or hung stage).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

from sglang_omni.aio.race import race
from sglang_omni.aio.threads import Threads, join_all
from sglang_omni.config.schema import PROCESS_FACTORY
from sglang_omni.config.stages import GENERATION_FACTORY
from sglang_omni.contract.gpu_turns import GpuTurns, Turn
from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.contract.messages import (
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
    ToServer,
    ToStage,
    decode_to_stage,
    job_of,
)
from sglang_omni.contract.result import Frames
from sglang_omni.engines.base import build_engine
from sglang_omni.engines.memory_faults import (
    device_memory,
    free_device_memory,
    is_out_of_memory,
    out_of_memory_error,
)
from sglang_omni.errors import BadRequest, OmniError, ServerError
from sglang_omni.media.stats import MEDIA_STATS
from sglang_omni.runtime.ipc import Channel, PackedHeader, WireEncodeError, pack_header
from sglang_omni.runtime.log_format import configure_logging
from sglang_omni.runtime.proc import die_with_parent, kill_group, start_idle_child
from sglang_omni.runtime.request_media import RequestMediaStore

log = logging.getLogger("sglang_omni.stage")


FATAL_EXIT_CODE = 3
#: A stage whose server sent no heartbeat for this many times the stage's ``stall_timeout_s``
#: (the time after which the server gives up on a silent stage) exits with its children.
SERVER_SILENCE_FACTOR = 2.0
#: ... and never sooner than this (a server loop held up a few seconds is not frozen).
MIN_SERVER_SILENCE_S = 10.0
#: Messages up to this size, sent from the event loop with none queued, are written at once
#: (far below the socket's buffer: the write does not wait for the server to read).
DIRECT_SEND_BYTES = 64 * 1024
#: The signal that makes a ready stage write every thread's Python stack to its log (stderr),
#: from C (``faulthandler``): it works while a thread holds the GIL. The server sends it to a
#: stage it found stalled or hung before it kills it, so the log says where the stage was.
STACKS_SIGNAL = signal.SIGUSR1
#: A job's progress reports reach the server at most this often (the rest are dropped).
PROGRESS_EVERY_S = 0.5
#: At exit, the stage's threads are joined within this many seconds (those left are logged;
#: the server kills a stage that has not exited 5 s after it asked it to stop).
THREAD_JOIN_S = 2.0


def stage_main(spec: EngineSpec, device_env: str, sock: socket.socket, log_level: str,
               log_format: str = "text", scratch: str | None = None) -> None:
    """Run a stage until shutdown; the exit code is 0 on a clean stop, 1 on startup failure,
    3 when the engine failed while serving. ``scratch``: the folder this process's temporary
    files go in (``tempfile``'s default here; its owner, the server, removes it once the
    process is gone, however it ended)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = device_env
    if scratch is not None:
        tempfile.tempdir = scratch
    os.setpgid(0, 0)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server coordinates Ctrl-C
    configure_logging(log_level, log_format, stage=spec.stage)
    code = asyncio.run(_StageServer(spec, Channel(sock),
                                    stop_reading=lambda: _shut_reading(sock)).serve())
    join_all(THREAD_JOIN_S)  # what an engine's close left (each owner logs its own)
    _log_threads_left()
    sys.exit(code)


def _shut_reading(sock: socket.socket) -> None:
    """End the reader thread's blocked read (it sees the end of the stream); sending goes on."""
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass  # the connection is gone already: the reader has seen it


def _log_threads_left() -> None:
    """Say which threads besides the main thread are still running as the stage exits."""
    left = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    if left:
        log.warning("exiting with %d thread(s) still running: %s", len(left), ", ".join(left))
    else:
        log.info("exiting: no thread left besides the main thread")


def _process_started() -> float:
    """The wall-clock time this process started (the kernel's record)."""
    import psutil

    return float(psutil.Process().create_time())


def startup_parts(engine: Any, build_s: float, start_s: float) -> str:
    """The engine's start in parts, for the ready line: ``engine module B s`` (importing and
    building the engine), then the parts the engine reports (``startup_parts()``: e.g.
    ``imports``, ``weights``, ``warm-up``; what is left of its start is ``other``), else
    ``start S s``; then what ran beside them (``beside them: weights read-ahead R s, ...``)."""
    parts, beside = {}, {}
    report = getattr(engine, "startup_parts", None)
    if callable(report):
        parts, beside = report()
    shown = [("engine module", build_s)]
    if parts:
        shown += list(parts.items())
        shown.append(("other", max(0.0, start_s - sum(parts.values()))))
    else:
        shown.append(("start", start_s))
    text = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in shown)
    if beside:
        text += "; beside them: " + ", ".join(f"{name} {seconds:.1f} s"
                                              for name, seconds in beside.items())
    return text


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Drop the tracebacks of ``exc`` and the errors it chains: their frames hold what the
    failed call allocated."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _paused_spans(spans: dict[str, float], turn: Turn) -> None:
    """Report a job's waits for the GPU as its ``paused`` span, and take its pauses out of its
    ``denoise`` (an engine pauses inside its denoising loop)."""
    waited = turn.waited_s + turn.paused_s
    if waited > 0:
        spans["paused"] = waited
    if turn.paused_s > 0 and "denoise" in spans:
        spans["denoise"] = max(0.0, spans["denoise"] - turn.paused_s)


def _before_engine(job: Job) -> str:
    """What an abort log line adds for a job its engine never ran (an abort that arrived with
    its submit, or while it waited for the GPU): nothing for a job the engine had."""
    if job.began:
        return ""
    waited = job.turn.waited_s if job.turn is not None else 0.0
    return " before its engine began it" + (
        f" (it waited {waited:.1f} s for the GPU)" if waited > 0 else "")


def _log_send_failure(sent: Future) -> None:
    exc = sent.exception() if not sent.cancelled() else None
    if exc is not None:
        log.error("sending a message to the server failed: %r", exc)


class _StageServer:
    def __init__(self, spec: EngineSpec, channel: Channel,
                 stop_reading: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self.channel = channel
        #: The reader and server-watch threads; stopped and joined as :meth:`serve` ends.
        self.threads = Threads(f"the {spec.stage} stage")
        self._stop_reading = stop_reading
        self._exiting = threading.Event()
        self.sender = ThreadPoolExecutor(1, thread_name_prefix="stage-send")
        #: Messages queued for the sender thread and not sent yet, and the event loop's thread.
        self._queue_lock = threading.Lock()
        self._queued = 0
        self._loop_thread: int | None = None
        self.jobs: dict[str, tuple[Job, asyncio.Task, int]] = {}
        self.children: list[Any] = []
        #: The media items of the running requests (each sent once per request).
        self.media = RequestMediaStore(spec.stage)
        #: monotonic time of the server's last heartbeat (None before the first).
        self.last_ping: float | None = None
        #: A generation stage's GPU turns (the oldest request's job first); None elsewhere.
        budget = spec.factory.get("pause_budget_bytes")
        if budget is None:
            budget = GENERATION_FACTORY["pause_budget_bytes"].default
        self.turns = GpuTurns(int(budget)) \
            if spec.role == "generation" else None
        #: What each message from the server does (on the loop; ``Ping`` is the reader's).
        self._handlers: dict[type, Callable[[Any, Frames], None]] = {
            Submit: self._submit, Abort: self._abort, End: self._end, Shutdown: self._shutdown}

    def send(self, message: ToServer, frames: Frames | None = None) -> None:
        """Send a message to the server; ordered, safe from any thread. Packs here, so
        WireEncodeError reaches the caller when the header cannot be carried.

        A small message sent from the event loop while nothing is queued goes out at once (the
        socket's buffer takes it: no hand-off to the sender thread); any other waits its turn
        in the sender thread's queue, so what a thread sent before the loop's message still
        goes first."""
        packed = pack_header(message, len(frames or []))
        size = packed.nbytes + sum(len(frame) for frame in frames or [])
        op = message.op
        with self._queue_lock:
            direct = self._queued == 0 and size <= DIRECT_SEND_BYTES \
                and threading.get_ident() == self._loop_thread
            if not direct:
                self._queued += 1
        if direct:
            self._send_packed(packed, frames, op)
            return
        sent = self.sender.submit(self._send_queued, packed, frames, op)
        sent.add_done_callback(_log_send_failure)

    def _send_queued(self, packed: PackedHeader, frames: Frames | None, op: str) -> None:
        try:
            self._send_packed(packed, frames, op)
        finally:
            with self._queue_lock:
                self._queued -= 1

    def _send_packed(self, packed: PackedHeader, frames: Frames | None, op: str) -> None:
        try:
            self.channel.send_packed(packed, frames)
        except (OSError, EOFError):
            log.warning("server connection lost; dropping %s", op)

    def _send_now(self, message: ToServer, frames: Frames | None) -> None:
        try:
            self.channel.send(message, frames)
        except (OSError, EOFError, ValueError):
            log.warning("server connection lost; dropping %s", message.op)

    def send_error(self, rid: str, token: int, error: OmniError) -> None:
        """Fail job ``token`` of request ``rid`` with ``error``'s status, type and message; a
        message that is not valid Unicode is escaped, never dropped."""
        safe = error.message.encode("utf-8", "backslashreplace").decode("utf-8")
        self.send(Error(rid, token, safe, error.status, error.type))

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.stopping = asyncio.Event()
        for _ in range(int(self.spec.factory.get("children", 0) or 0)):
            self.children.append(start_idle_child())
        began = time.time()  # the process's own start is before this: spawn and imports
        try:
            self.engine = build_engine(self.spec)
            built = time.time()
            await self.engine.start()
        except Exception as exc:  # noqa: BLE001 - any startup failure is reported, then exit 1
            log.error("startup failed: %s\n%s", exc, traceback.format_exc())
            self._send_now(Failed(str(exc)), None)
            self._stop_children()
            return 1
        # Installed after start: a native engine may install its own handlers while starting.
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
        self.threads.start(self._read_loop, loop, name="stage-reader", stop=self._stop_reading)
        stall_s = float(self.spec.factory.get("stall_timeout_s")
                        or PROCESS_FACTORY["stall_timeout_s"].default)
        silence_s = max(MIN_SERVER_SILENCE_S, SERVER_SILENCE_FACTOR * stall_s)
        self.threads.start(self._watch_server, silence_s, name="server-watch",
                           stop=self._exiting.set)
        self._send_now(Ready(os.getpid(), bool(
            getattr(self.engine, "stops_server_on_exit", False))), None)
        log.info("ready (backend %s) %.1f s after the process started: %.1f s to reach the "
                 "engine, %.1f s in the engine's start (%s)",
                 self.spec.backend, time.time() - _process_started(), began - _process_started(),
                 time.time() - began, startup_parts(self.engine, built - began,
                                                    time.time() - built))
        fatal = await self._until_stop_or_failure()
        if fatal is not None:
            log.error("stopping: %s", fatal)
            self.send(Fatal(fatal))  # queued: jobs may be sending
        for job, task, _ in list(self.jobs.values()):
            job.cancelled.set()
            task.cancel()
        if self.jobs:
            await asyncio.gather(*(t for _, t, _ in self.jobs.values()), return_exceptions=True)
        await self.engine.close()
        self._stop_children()
        self.sender.shutdown(wait=True)
        await asyncio.to_thread(self._stop_threads)
        return 0 if fatal is None else FATAL_EXIT_CODE

    def _stop_threads(self) -> None:
        """Stop the reader (its read ends) and the server watch, and join them."""
        self._exiting.set()
        self.threads.join(THREAD_JOIN_S)

    async def _until_stop_or_failure(self) -> str | None:
        """Wait for a shutdown request (None) or the engine's failure report (its message)."""
        watch = getattr(self.engine, "watch", None)
        if watch is None:
            await self.stopping.wait()
            return None
        try:
            finish = await race(self.stopping.wait(), watch())
        except Exception as exc:  # noqa: BLE001 - the watch's failure is the engine's failure
            return f"the engine's watch failed: {exc!r}"
        return None if finish.index == 0 else str(finish.value)

    def _stop_children(self) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            try:
                child.wait(timeout=5)
            except Exception:  # noqa: BLE001
                child.kill()

    def _pong(self, seq: int | None) -> None:
        """Answer a heartbeat (``seq``: None when sent unasked, while a message is arriving)."""
        stats = getattr(self.engine, "stats", None)
        engine = dict(stats()) if stats is not None else {}
        if self.turns is not None:
            engine.update(self.turns.stats())
        self._send_now(Pong(seq, MEDIA_STATS.snapshot(), dict(self.media.stats()),
                            device_memory(), engine or None), None)

    def _receiving(self, moved: bool) -> None:
        """A long message is arriving: answer the heartbeat waiting behind it; while its bytes
        keep coming (``moved``) the server is alive, as a ping would say."""
        if moved and self.last_ping is not None:
            self.last_ping = time.monotonic()
        self._pong(None)

    def _read_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            header: dict[str, Any] | None = None
            try:
                # a long message (a request's media) is answered for while it arrives: the
                # server's ping waits behind it
                header, frames = self.channel.recv(keepalive=self._receiving)
                message = decode_to_stage(header)
            except (EOFError, OSError):
                if not self._exiting.is_set():
                    loop.call_soon_threadsafe(self.stopping.set)
                return
            except ProtocolError as exc:  # a server bug: reported, the stage serves on
                self._protocol_error(header, exc)
                continue
            except Exception:  # noqa: BLE001 - a garbled message is dropped, not fatal
                log.exception("undecodable message from the server")
                continue
            if isinstance(message, Ping):  # answered here: the event loop may be busy
                self.last_ping = time.monotonic()
                self._pong(message.seq)
                continue
            loop.call_soon_threadsafe(self._handle, message, frames)

    def _protocol_error(self, header: dict[str, Any] | None, exc: ProtocolError) -> None:
        """A message from the server failed to decode: log it, and fail the job it names
        plainly, if any, with one error answer (its request ends instead of waiting)."""
        log.error("a message from the server failed to decode (a server bug): %s", exc)
        job = job_of(header)
        if job is not None and exc.message_type == Submit.op:
            self.send_error(*job, ServerError(
                f"the {self.spec.stage} stage could not read request {job[0]}'s job ({exc}); "
                "report this server bug"))

    def _watch_server(self, limit_s: float) -> None:
        """Take the stage's process group down once the server, having begun its heartbeats,
        sent none for ``limit_s`` (a thread: the event loop may be busy)."""
        while not self._exiting.wait(min(1.0, limit_s / 4)):
            last = self.last_ping
            if last is not None and time.monotonic() - last > limit_s:
                log.error("the server sent no heartbeat for %.0f s (it is frozen or gone); "
                          "exiting with this stage's children so their GPUs are freed",
                          time.monotonic() - last)
                kill_group(os.getpgid(0))
                return

    def _handle(self, message: ToStage, frames: Frames) -> None:
        """Apply a message from the server (on the loop), by its type."""
        self._handlers[type(message)](message, frames)

    def _shutdown(self, _: Shutdown, __: Frames) -> None:
        self.stopping.set()

    def _abort(self, message: Abort, __: Frames) -> None:
        entry = self.jobs.get(message.rid)
        if entry is not None:
            job, task, _ = entry
            job.cancelled.set()
            task.cancel()
        self._end_request(message.rid)

    def _end(self, message: End, __: Frames) -> None:
        self._end_request(message.rid)

    def _submit(self, message: Submit, frames: Frames) -> None:
        rid, token = message.rid, message.token
        if rid in self.jobs:
            self.send_error(rid, token,
                            BadRequest(f"request {rid} is already running on this stage"))
            return
        if message.wire_error is not None:  # a server bug: the request fails, the stage serves on
            log.error("request %s: %s", rid, message.wire_error)
            self.send_error(rid, token, ServerError(
                f"the {self.spec.stage} stage received request {rid}'s media garbled "
                f"({message.wire_error}); report this server bug"))
            return
        if message.media is not None:
            try:
                frames = self.media.frames_for(rid, message.media, frames)
            except OmniError as exc:
                log.warning("request %s failed: %s", rid, exc.message)
                self.send_error(rid, token, exc)
                return

        def emit(data: dict[str, Any], r: str = rid, t: int = token) -> None:
            self.send(Chunk(r, t, data))

        job = Job(rid, message.payload, frames, emit=emit,
                  progress=self._progress_reporter(rid, token))
        if self.turns is not None:
            order = message.order
            job.turn = self.turns.turn(
                rid, float(order) if order is not None else time.monotonic(),
                job.cancelled, job.progress)
        task = asyncio.get_running_loop().create_task(self._run(job, token))
        started = time.perf_counter()

        def done(t: asyncio.Task, j: Job = job, k: int = token, t0: float = started) -> None:
            self._finished(j, k, t, t0)

        task.add_done_callback(done)
        self.jobs[rid] = (job, task, token)

    async def _run(self, job: Job, token: int) -> Any:
        """The engine's run of ``job``, within its GPU turn on a generation stage; ``started``
        tells the server as the engine takes it."""
        turn = job.turn
        if turn is None:
            self._began(job, token)
            return await self.engine.run(job)
        await turn.begin()
        self._began(job, token)
        try:
            return await self.engine.run(job)
        finally:
            turn.end()

    def _began(self, job: Job, token: int) -> None:
        job.began = True
        self.send(Started(job.rid, token))

    def _progress_reporter(self, rid: str, token: int) -> Callable[[], None]:
        """``job.progress`` of one job: sends ``progress`` at most every PROGRESS_EVERY_S;
        callable from any thread (a lost race sends one extra report, harmlessly)."""
        last = [float("-inf")]

        def progress() -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                self.send(Progress(rid, token))

        return progress

    def _end_request(self, rid: str) -> None:
        """Drop ``rid``'s media and let an engine that keeps per-request state drop ``rid``'s."""
        self.media.release(rid)
        end = getattr(self.engine, "end_request", None)
        if end is not None:
            end(rid)

    def _finished(self, job: Job, token: int, task: asyncio.Task, started: float) -> None:
        """Report a job's outcome; runs even when the job was aborted before it started."""
        self.jobs.pop(job.rid, None)
        if job.turn is not None:
            _paused_spans(job.spans, job.turn)
        rid = job.rid
        if task.cancelled():
            log.info("request %s aborted%s", rid, _before_engine(job))
            self.send(Aborted(rid, token))
            return
        exc = task.exception()
        if exc is None:
            result = task.result()
            try:
                self.send(Result(rid, token, cast(dict[str, Any], result.payload),
                                 time.perf_counter() - started, job.spans), result.frames)
            except WireEncodeError as bad:
                log.error("request %s: its result cannot be sent: %s", job.rid, bad)
                self.send_error(rid, token, ServerError(
                    f"the {self.spec.stage} stage produced a result the stage wire cannot carry "
                    f"({bad}); report this engine bug"))
        elif isinstance(exc, OmniError):
            log.warning("request %s failed: %s", job.rid, exc.message)
            self.send_error(rid, token, exc)
        elif is_out_of_memory(exc):  # the request fails; the stage frees its memory and serves on
            log.error("request %s: out of memory: %s", job.rid, exc)
            self.send_error(rid, token,
                            out_of_memory_error(self.spec.stage, self.spec.role, str(exc)))
            _drop_tracebacks(exc)
            self._end_request(job.rid)  # the request fails: what the engine keeps for it goes
            free_device_memory()
        else:  # an engine bug fails the request, not the stage
            log.error("request %s failed: %s\n%s", job.rid, exc,
                      "".join(traceback.format_exception(exc)))
            self.send_error(rid, token, ServerError(  # the detail is logged, never sent
                f"the {self.spec.stage} stage failed this request unexpectedly; its log has the "
                "details"))
