"""``aio.race``: the first contender's outcome is the caller's; every loser is cancelled and
awaited before it returns; cancelling the caller cancels them all; no exception is ever left
unread (a stage dying fails the call and dooms the request at once)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from sglang_omni.aio.race import Finish, race, to_the_end


def _run_checking_unretrieved(scenario: Any) -> Any:
    """Run ``scenario()``; fail if the loop reported an unretrieved exception or a coroutine
    never awaited."""
    reports: list[dict[str, Any]] = []

    async def main() -> Any:
        asyncio.get_running_loop().set_exception_handler(lambda _l, c: reports.append(c))
        try:
            return await scenario()
        finally:
            gc.collect()
            await asyncio.sleep(0)

    with _no_never_awaited():
        result = asyncio.run(main())
    gc.collect()
    assert not [c for c in reports if "never retrieved" in str(c.get("message"))], reports
    return result


class _no_never_awaited:  # noqa: N801 - a context manager read as a phrase
    def __enter__(self) -> None:
        self._catch = warnings.catch_warnings(record=True)
        self.caught = self._catch.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)
        never = [w for w in self.caught if "never awaited" in str(w.message)]
        assert not never, [str(w.message) for w in never]


def test_the_winner_value_is_returned_and_the_loser_cancelled_and_awaited() -> None:
    async def scenario() -> tuple[Finish, bool, bool]:
        cleaned = asyncio.Event()
        cancelled = False

        async def slow() -> None:
            nonlocal cancelled
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled = True
                await asyncio.sleep(0)  # its cleanup awaits: race waits for it
                cleaned.set()
                raise

        async def fast() -> int:
            return 7

        finish = await race(slow(), fast())
        return finish, cancelled, cleaned.is_set()

    finish, cancelled, cleaned = _run_checking_unretrieved(scenario)
    assert finish == Finish(1, 7) and cancelled and cleaned


def test_the_winner_exception_is_raised() -> None:
    async def scenario() -> None:
        async def bad() -> None:
            raise ValueError("the stage died")

        await race(bad(), asyncio.Event().wait())

    with pytest.raises(ValueError, match="the stage died"):
        _run_checking_unretrieved(scenario)


def test_cancelling_the_caller_cancels_and_awaits_every_contender() -> None:
    async def scenario() -> list[str]:
        ended: list[str] = []

        async def wait(name: str) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)
                ended.append(name)

        caller = asyncio.ensure_future(race(wait("a"), wait("b")))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return sorted(ended)  # both ended before the caller did

    assert _run_checking_unretrieved(scenario) == ["a", "b"]


def test_a_failure_the_cancelled_caller_never_reads_is_not_reported_as_unretrieved() -> None:
    async def scenario() -> None:
        failed = asyncio.Event()

        async def work() -> None:
            await failed.wait()
            raise RuntimeError("the stage died")

        caller = asyncio.ensure_future(race(work(), asyncio.Event().wait()))
        await asyncio.sleep(0)  # the caller waits on the work
        failed.set()  # the work fails ...
        await asyncio.sleep(0)
        caller.cancel()  # ... and the caller is cancelled before it reads the failure
        await asyncio.gather(caller, return_exceptions=True)

    _run_checking_unretrieved(scenario)


def test_a_winner_that_ended_cancelled_by_itself_raises_cancelled() -> None:
    async def scenario() -> None:
        async def self_cancelled() -> None:
            raise asyncio.CancelledError()

        await race(self_cancelled(), asyncio.Event().wait())

    with pytest.raises(asyncio.CancelledError):
        _run_checking_unretrieved(scenario)


def test_ties_go_to_the_first_in_call_order() -> None:
    async def scenario() -> Finish:
        async def now(value: int) -> int:
            return value

        return await race(now(1), now(2))

    assert _run_checking_unretrieved(scenario) == Finish(0, 1)


def test_to_the_end_finishes_its_work_when_the_caller_is_cancelled_then_raises() -> None:
    async def scenario() -> tuple[bool, bool]:
        finished = asyncio.Event()

        async def cleanup() -> None:
            await asyncio.sleep(0.01)
            finished.set()

        caller = asyncio.ensure_future(to_the_end(cleanup()))
        await asyncio.sleep(0)
        caller.cancel()
        result = await asyncio.gather(caller, return_exceptions=True)
        return finished.is_set(), isinstance(result[0], asyncio.CancelledError)

    assert _run_checking_unretrieved(scenario) == (True, True)
