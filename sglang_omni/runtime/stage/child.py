"""One stage process as the server sees it: spawn, exit notice on the event loop, signals, and
the process's temporary-file folder.

:meth:`StageChild.spawn` starts ``stage.process.stage_main`` with the ``spawn`` method, pinned to
its GPUs, with a fresh temporary-file folder (``scratch``), and returns the server's end of its
channel. ``on_exit()`` is called on the loop once the process has exited, after it was reaped
(``exitcode`` is then set): the loop's selector watches a pidfd (Linux 5.3 and later), so no
thread and no poll waits for it; where the kernel has none, a thread joins the process and hands
the exit to the loop. :meth:`wait` awaits the exit for a while, without polling. The scratch
folder is removed off the loop (:meth:`remove_scratch`), once the process is gone, however it
ended.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable

from sglang_omni.aio.threads import Threads
from sglang_omni.config.gpus import device_env
from sglang_omni.contract.job import EngineSpec
from sglang_omni.runtime.ipc import channel_pair
from sglang_omni.runtime.proc import kill_led_group
from sglang_omni.runtime.stage.process import STACKS_SIGNAL, stage_main

log = logging.getLogger("sglang_omni.runtime")

#: How long a stage found stalled or hung is given to write its threads' stacks to the log
#: before its group is killed (a frozen process writes nothing: the kill comes all the same).
STACKS_WAIT_S = 0.5


class StageChild:
    """One spawned stage process; use from the loop that spawned it."""

    def __init__(self, spec: EngineSpec, log_level: str, log_format: str,
                 on_exit: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_exit = on_exit
        self.exited: asyncio.Future[None] = self._loop.create_future()
        self.scratch: str | None = tempfile.mkdtemp(prefix=f"sgl-omni-{spec.stage}-")
        ours, theirs = channel_pair()
        self.process = mp.get_context("spawn").Process(
            target=stage_main,
            args=(spec, device_env(spec.gpu), theirs, log_level, log_format, self.scratch),
            name=f"sgl-omni-{spec.stage}", daemon=False)
        self.sock = ours
        self._theirs = theirs
        self._pidfd: int | None = None
        #: The thread that joins the process where the kernel has no pidfd (it ends with the
        #: process; :meth:`join_threads` joins it once the process was stopped).
        self._threads = Threads(f"the {spec.stage} stage's exit watch")

    def spawn(self) -> socket.socket:
        """Start the process and watch for its exit; the server's end of its channel."""
        self.process.start()
        self._theirs.close()
        self._watch()
        return self.sock

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def _watch(self) -> None:
        pid = self.process.pid
        assert pid is not None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here: a thread joins the process
            self._threads.start(self._join_thread, name=f"{self.process.name}-watch")
            return
        self._loop.add_reader(self._pidfd, self._reaped)

    def _join_thread(self) -> None:
        self.process.join()
        try:
            self._loop.call_soon_threadsafe(self._reaped)
        except RuntimeError:  # the loop is closed: nobody waits any more
            return

    def _reaped(self) -> None:
        """The process exited (its pidfd is readable, or the thread joined it): reap it, then
        tell the owner."""
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if self.exited.done():
            return
        self.process.join(0)  # reaps the zombie: exitcode is set
        self.exited.set_result(None)
        self._on_exit()

    async def join_threads(self, timeout_s: float) -> list[str]:
        """Join the exit-watch thread, if any (call once the process is gone; off the loop);
        the names of those still running, logged."""
        if not self._threads.alive():
            return []
        return await asyncio.to_thread(self._threads.join, timeout_s)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the process to exit; whether it did."""
        if self.exited.done():
            return True
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.exited)
        except TimeoutError:
            return False
        return True

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process and the children left in its group."""
        kill_led_group(self.process.pid, self.process.exitcode is not None, sig)

    def kill_group_after_stacks(self) -> None:
        """Ask the ready process to write its threads' stacks to the log (``STACKS_SIGNAL``),
        then kill its group :data:`STACKS_WAIT_S` later (on the loop); at once where the
        process is gone."""
        pid = self.process.pid
        if pid is None or self.process.exitcode is not None:
            self.kill_group()
            return
        try:
            os.kill(pid, STACKS_SIGNAL)
        except ProcessLookupError:
            self.kill_group()
            return
        self._loop.call_later(STACKS_WAIT_S, self.kill_group)

    def remove_scratch(self) -> asyncio.Future[None] | None:
        """Remove the process's temporary-file folder off the loop (call once it is gone); the
        removal's future, None when there is nothing to remove."""
        path, self.scratch = self.scratch, None
        if path is None:
            return None
        return self._loop.run_in_executor(None, shutil.rmtree, path, True)
