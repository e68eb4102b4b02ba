"""The server's handle on one stage process: launch, ready handshake, calls, aborts, death.

Every call carries the request id and a fresh dispatch token; a message from the stage whose
(rid, token) is not the pending call's is dropped, so a late, duplicated or forged result never
advances a request. When the stage process dies, every pending call fails within about a second
with ``StageDied`` and the handle reports unhealthy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.config.gpus import device_env
from sglang_omni.engines.base import EngineSpec
from sglang_omni.errors import OmniError, ServerError, StageDied
from sglang_omni.runtime.ipc import Channel, Frames, channel_pair
from sglang_omni.runtime.proc import kill_group
from sglang_omni.runtime.stage_process import stage_main
from sglang_omni.runtime.stage_result import StageResult

log = logging.getLogger("sglang_omni.runtime")

ChunkCallback = Callable[[dict[str, Any]], None]


class StageStartupError(Exception):
    """A stage did not become ready; the message says why and what to change."""


class StageCallError(OmniError):
    """A stage answered a call with an error; carries the stage's status and type."""

    def __init__(self, message: str, status: int, type_: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


@dataclass
class _Pending:
    token: int
    future: asyncio.Future
    on_chunk: ChunkCallback | None
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class StageCounters:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    dropped: int = 0


class StageHandle:
    """Owns one stage process. Use from a single asyncio loop."""

    def __init__(self, spec: EngineSpec, startup_timeout_s: float, log_level: str = "info"):
        self.spec = spec
        self.name = spec.stage
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self.ready = False
        self.dead = False
        self.exitcode: int | None = None
        #: Whether the stage's engine asked for the server to stop when this stage exits (sent
        #: with ``ready``), and the reason a ``fatal`` message gave, if any.
        self.stops_server_on_exit = False
        self.fatal_message: str | None = None
        self.counters = StageCounters()
        self._pending: dict[str, _Pending] = {}
        self._tokens = itertools.count(1)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-send")
        self._process: mp.process.BaseProcess | None = None
        self._channel: Channel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_future: asyncio.Future | None = None
        self._closing = False
        self.death_listeners: list[Callable[[StageHandle], None]] = []

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def healthy(self) -> bool:
        return self.ready and not self.dead

    async def start(self) -> None:
        """Spawn the process and wait for its ready message; StageStartupError on failure."""
        self._loop = asyncio.get_running_loop()
        self._ready_future = self._loop.create_future()
        ctx = mp.get_context("spawn")
        ours, theirs = channel_pair()
        self._process = ctx.Process(
            target=stage_main,
            args=(self.spec, device_env(self.spec.gpu), theirs, self.log_level),
            name=f"sgl-omni-{self.name}", daemon=False,
        )
        self._process.start()
        theirs.close()
        self._channel = Channel(ours)
        threading.Thread(target=self._read_loop, daemon=True,
                         name=f"{self.name}-recv").start()
        threading.Thread(target=self._watch, daemon=True, name=f"{self.name}-watch").start()
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_future), self.startup_timeout_s)
        except TimeoutError:
            await self.stop()
            raise StageStartupError(
                f"the {self.name} stage did not become ready within {self.startup_timeout_s:g} s; "
                f"raise stages.{self.name}.factory.startup_timeout_s or check its log above"
            ) from None
        self.ready = True

    # --- calls ------------------------------------------------------------------------------
    async def call(self, rid: str, payload: dict[str, Any], frames: Frames | None = None,
                   on_chunk: ChunkCallback | None = None) -> StageResult:
        """Run ``payload`` on the stage for request ``rid``.

        Chunks go to ``on_chunk`` in order. Cancelling the awaiting task aborts the job on the
        stage. Raises StageDied, StageCallError or ServerError.
        """
        if self.dead or not self.ready:
            raise StageDied(f"the {self.name} stage is not running; the server is unhealthy")
        if rid in self._pending:
            raise ServerError(f"request {rid} already has a call in flight on {self.name}")
        token = next(self._tokens)
        pending = _Pending(token, asyncio.get_running_loop().create_future(), on_chunk)
        self._pending[rid] = pending
        self.counters.submitted += 1
        self._post({"op": "submit", "rid": rid, "token": token, "payload": payload}, frames)
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            if not pending.future.done():
                log.info("request %s cancelled; aborting its job on the %s stage", rid, self.name)
                self.abort(rid)
            raise
        finally:
            if self._pending.get(rid) is pending:
                del self._pending[rid]

    def abort(self, rid: str) -> None:
        """Tell the stage to stop ``rid``'s job; its late messages are dropped from now on."""
        pending = self._pending.pop(rid, None)
        if pending is not None and not pending.future.done():
            pending.future.cancel()
        if not self.dead:
            self._post({"op": "abort", "rid": rid}, None)

    def _post(self, header: dict[str, Any], frames: Frames | None) -> None:
        self._sender.submit(self._send_now, header, frames)

    def _send_now(self, header: dict[str, Any], frames: Frames | None) -> None:
        try:
            assert self._channel is not None
            self._channel.send(header, frames)
        except (OSError, EOFError, ValueError, AssertionError):
            log.debug("%s: could not send %s (stage gone)", self.name, header.get("op"))

    # --- receiving --------------------------------------------------------------------------
    def _read_loop(self) -> None:
        assert self._channel is not None and self._loop is not None
        while True:
            try:
                header, frames = self._channel.recv()
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - a garbled message is dropped, not fatal
                log.exception("%s: undecodable message from stage", self.name)
                continue
            try:
                self._loop.call_soon_threadsafe(self._on_message, header, frames)
            except RuntimeError:
                return

    def _on_message(self, header: dict[str, Any], frames: Frames) -> None:
        op = header.get("op")
        if op == "ready":
            self.stops_server_on_exit = bool(header.get("stops_server_on_exit"))
            if self._ready_future and not self._ready_future.done():
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
        if op == "aborted":
            self.counters.aborted += 1
            return
        rid = header.get("rid")
        pending = self._pending.get(rid) if isinstance(rid, str) else None
        if pending is None or header.get("token") != pending.token or pending.future.done():
            self.counters.dropped += 1
            log.debug("%s: dropped stale %s for %s", self.name, op, rid)
            return
        if op == "chunk":
            if pending.on_chunk is not None:
                pending.on_chunk(header.get("data") or {})
        elif op == "result":
            self.counters.completed += 1
            pending.future.set_result(StageResult(header.get("payload") or {}, frames,
                                                  float(header.get("engine_s", 0.0))))
        elif op == "error":
            self.counters.failed += 1
            pending.future.set_exception(StageCallError(
                str(header.get("message")), int(header.get("status", 500)),
                str(header.get("type", "server_error"))))
        else:
            self.counters.dropped += 1

    def _watch(self) -> None:
        assert self._process is not None and self._loop is not None
        self._process.join()
        try:
            self._loop.call_soon_threadsafe(self._on_exit)
        except RuntimeError:
            return

    def _on_exit(self) -> None:
        assert self._process is not None
        self.exitcode = self._process.exitcode
        self.dead = True
        if self._process.pid:
            kill_group(self._process.pid)  # its children go with it
        if self._ready_future and not self._ready_future.done():
            self._ready_future.set_exception(StageStartupError(
                f"the {self.name} stage exited with code {self.exitcode} before it was ready; "
                "see its log above"))
        if self._closing:
            return
        log.error("the %s stage process exited with code %s; failing %d in-flight request(s)",
                  self.name, self.exitcode, len(self._pending))
        why = f"code {self.exitcode}" if self.fatal_message is None \
            else f"code {self.exitcode}: {self.fatal_message}"
        for rid, pending in list(self._pending.items()):
            if not pending.future.done():
                pending.future.set_exception(StageDied(
                    f"the {self.name} stage process exited ({why}) while request "
                    f"{rid} was running; the server is unhealthy and needs a restart"))
        self._pending.clear()
        for listener in self.death_listeners:
            listener(self)

    # --- shutdown ---------------------------------------------------------------------------
    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process and all its children; escalates to SIGTERM, then SIGKILL."""
        self._closing = True
        proc = self._process
        if proc is None:
            return
        if proc.is_alive():
            self._post({"op": "shutdown"}, None)
            await _join(proc, grace_s)
        if proc.is_alive() and proc.pid:
            kill_group(proc.pid, signal.SIGTERM)
            await _join(proc, 3.0)
        if proc.pid:
            kill_group(proc.pid, signal.SIGKILL)
        await _join(proc, 3.0)
        self._sender.shutdown(wait=False)
        if self._channel is not None:
            self._channel.close()


async def _join(proc: mp.process.BaseProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
