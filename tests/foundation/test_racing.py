"""``work_unless``: the work's error is never left unread, even when the caller is cancelled
just as the work fails (a stage dying fails the call and dooms the request at once)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from sglang_omni.pipeline.racing import work_unless


def test_a_failure_the_cancelled_caller_never_reads_is_not_reported_as_unretrieved() -> None:
    unretrieved: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _loop, context: unretrieved.append(context))
        event = asyncio.Event()
        failed = asyncio.Event()

        async def work() -> None:
            await failed.wait()
            raise RuntimeError("the stage died")

        caller = asyncio.ensure_future(work_unless(work(), event))
        await asyncio.sleep(0)  # the caller waits on the work
        failed.set()  # the work fails ...
        await asyncio.sleep(0)
        caller.cancel()  # ... and the caller is cancelled before it reads the failure
        await asyncio.gather(caller, return_exceptions=True)
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(scenario())
    gc.collect()
    assert not [c for c in unretrieved if "never retrieved" in str(c.get("message"))], unretrieved


def test_the_work_result_or_error_is_returned_when_it_ends_first() -> None:
    async def scenario() -> tuple[Any, Any]:
        async def ok() -> int:
            return 7

        async def bad() -> int:
            raise ValueError("x")

        done = await work_unless(ok(), asyncio.Event())
        failed = await work_unless(bad(), asyncio.Event())
        return done.result(), type(failed.exception())

    assert asyncio.run(scenario()) == (7, ValueError)
