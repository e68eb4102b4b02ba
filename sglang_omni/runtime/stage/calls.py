"""The call table of one stage: the calls in flight, their dispatch tokens, the jobs the stage
process holds, and the stage's job messages applied to them.

Every call has a fresh dispatch token; a job message (``chunk``, ``result``, ``error``) whose
(rid, token) is not the pending call's is dropped and counted, so a late, duplicated or forged
message never advances a request; a ``started`` is counted only for an open job. A job stays
*open* from its submit until the stage says it ended (``result``, ``error`` or ``aborted``): an
aborted job stays open until then, and its waiter (:meth:`CallTable.aborting`) is released
then, or when the stage dies. The time of the last sign of progress on an open job is kept for
the liveness check (:meth:`silent_s`). Use from the server's event loop only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang_omni.contract.job import clean_spans
from sglang_omni.contract.messages import JOB_ENDS, Aborted, Chunk, Error, Result, Started
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.errors import OmniError, StageCallError

log = logging.getLogger("sglang_omni.runtime")

ChunkCallback = Callable[[dict[str, Any]], None]


@dataclass
class Pending:
    """One call in flight: its token, the future its caller awaits, where its chunks go."""

    token: int
    future: asyncio.Future
    on_chunk: ChunkCallback | None


@dataclass
class StageCounters:
    submitted: int = 0
    #: Jobs the stage's engine took (its ``started``; a generation job waits for its GPU turn
    #: first).
    started: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    dropped: int = 0
    #: Bytes of the jobs sent to the stage (each submit's header and frames), over every
    #: process the stage ran.
    sent_bytes: int = 0


class CallTable:
    """The calls in flight on one stage (see the module contract)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.pending: dict[str, Pending] = {}
        self.counters = StageCounters()
        #: Jobs (rid, token) sent to the current process that it has not ended yet.
        self.open: set[tuple[str, int]] = set()
        #: (rid, token) of aborted jobs -> set once the stage says the job ended (or dies).
        self._aborting: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._tokens = itertools.count(1)
        #: monotonic time of the last sign of progress on a job (a submit to an idle stage, a
        #: chunk, progress, result, error or aborted message, media received).
        self.last_progress = time.monotonic()

    def open_call(self, rid: str, on_chunk: ChunkCallback | None, sent_bytes: int,
                  token: int) -> Pending:
        """Register the call of ``rid`` with ``token`` (from :meth:`token`), about to be sent."""
        pending = Pending(token, asyncio.get_running_loop().create_future(), on_chunk)
        self.pending[rid] = pending
        if not self.open:  # an idle stage's silence is not a hang
            self.last_progress = time.monotonic()
        self.open.add((rid, token))
        self.counters.submitted += 1
        self.counters.sent_bytes += sent_bytes
        return pending

    def token(self) -> int:
        return next(self._tokens)

    def close_call(self, rid: str, pending: Pending) -> None:
        """The caller of ``pending`` is done with it."""
        if self.pending.get(rid) is pending:
            del self.pending[rid]

    def aborting(self, rid: str, token: int) -> asyncio.Future[None]:
        """A future set once the stage says the aborted job ``token`` of ``rid`` ended."""
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._aborting[(rid, token)] = ended
        return ended

    def forget_abort(self, rid: str, token: int) -> None:
        self._aborting.pop((rid, token), None)

    def fail_unsent(self, rid: str, pending: Pending, error: OmniError) -> None:
        """The submit of ``pending`` could not be sent: the stage holds no such job."""
        self.open.discard((rid, pending.token))
        if not pending.future.done():
            self.counters.failed += 1
            pending.future.set_exception(error)
        self.close_call(rid, pending)

    def fail_all(self, error_of: Callable[[str], OmniError]) -> list[str]:
        """Fail every pending call with ``error_of(rid)``; the rids of those failed."""
        failed = [rid for rid, pending in self.pending.items() if not pending.future.done()]
        for rid in failed:
            self.pending[rid].future.set_exception(error_of(rid))
        self.pending.clear()
        return failed

    def end_aborting(self) -> None:
        """A dead or stalled stage ends no more jobs: release every wait for an abort."""
        for ended in self._aborting.values():
            if not ended.done():
                ended.set_result(None)
        self._aborting.clear()

    def silent_s(self) -> float:
        """Seconds the stage has held a job without a sign of progress on any (0 when none)."""
        if not self.open:
            return 0.0
        return max(0.0, time.monotonic() - self.last_progress)

    def on_started(self, message: Started, _: Frames) -> None:
        """The stage's engine took a job: counted while the job is open (one that ended, or of
        an earlier process, is dropped and counted)."""
        self.last_progress = time.monotonic()
        if (message.rid, message.token) in self.open:
            self.counters.started += 1
        else:
            self.counters.dropped += 1
            log.debug("%s: dropped stale started for %s", self.stage, message.rid)

    def on_job_message(self, message: Chunk | Result | Error | Aborted, frames: Frames) -> None:
        """Apply a job message of the stage (a ``progress`` is the handle's)."""
        self.last_progress = time.monotonic()
        rid, token = message.rid, message.token
        if isinstance(message, JOB_ENDS):
            self._job_ended(rid, token)
        if isinstance(message, Aborted):
            self.counters.aborted += 1
            return
        pending = self._pending_of(rid, token)
        if pending is None:
            self.counters.dropped += 1
            log.debug("%s: dropped stale %s for %s", self.stage, message.op, rid)
            return
        if isinstance(message, Chunk):
            if pending.on_chunk is not None:
                pending.on_chunk(message.data)
        elif isinstance(message, Result):
            self.counters.completed += 1
            pending.future.set_result(StageResult(
                message.payload, frames, float(message.engine_s), self.stage,
                spans=clean_spans(message.spans)))
        else:
            self.counters.failed += 1
            pending.future.set_exception(StageCallError(message.message, message.status,
                                                        message.type))

    def fail_malformed(self, rid: str, token: int, ended: bool, error: OmniError) -> bool:
        """A message about job ``token`` of ``rid`` failed to decode: fail its call with
        ``error`` (``ended``: the message was one that ends a job). False when no call waits
        for that job (the message is then dropped like a stale one)."""
        self.last_progress = time.monotonic()
        if ended:
            self._job_ended(rid, token)
        pending = self._pending_of(rid, token)
        if pending is None:
            return False
        self.counters.failed += 1
        pending.future.set_exception(error)
        return True

    def _pending_of(self, rid: str, token: int) -> Pending | None:
        pending = self.pending.get(rid)
        if pending is None or token != pending.token or pending.future.done():
            return None
        return pending

    def _job_ended(self, rid: str, token: int) -> None:
        self.open.discard((rid, token))
        ended = self._aborting.pop((rid, token), None)
        if ended is not None and not ended.done():
            ended.set_result(None)  # an aborted job's last word, whichever it is
