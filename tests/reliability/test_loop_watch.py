"""The loop watcher (``runtime.loop_watch``) names a callback that blocks the loop by itself (a
sleep on the loop), and not one whose wait was for the interpreter lock while the process's
other threads ran (``gil_wait``: worker threads doing work handed off the loop)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from sglang_omni.runtime import loop_watch


def test_a_sleep_on_the_loop_is_named(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        loop_watch.watch(asyncio.get_running_loop(), 0.05)
        asyncio.get_running_loop().call_soon(time.sleep, 0.15)
        await asyncio.sleep(0.3)

    callbacks = list(gc.callbacks)
    try:
        with caplog.at_level(logging.WARNING, logger="sglang_omni.loop"):
            asyncio.run(main())
    finally:
        asyncio.events.Handle._run = loop_watch._original_run  # type: ignore[method-assign]
        loop_watch._limit_s = None
        gc.callbacks[:] = callbacks
    assert any("Executing" in r.getMessage() and "sleep" in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_wait_while_other_threads_ran_is_the_interpreter_lock() -> None:
    assert loop_watch.gil_wait(waited_s=0.05, others_cpu_s=0.04)
    assert not loop_watch.gil_wait(waited_s=0.15, others_cpu_s=0.0)  # a sleep, threads idle
