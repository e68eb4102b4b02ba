"""``RequestStates.hold``: a request's state is released exactly once, by the exit of its
``async with``, however the body ends (returns, raises, is cancelled); its streams are closed
first, the outermost first; a released state acquires nothing; ``live`` counts the states that
hold something."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from sglang_omni.pipeline.request_state import RequestState, RequestStates


def _states() -> tuple[RequestStates, list[RequestState]]:
    released: list[RequestState] = []
    return RequestStates(released.append), released


def test_a_state_is_live_from_its_first_acquisition_until_its_one_release() -> None:
    async def scenario() -> tuple[int, int, int, int]:
        states, released = _states()
        async with states.hold() as state:
            before = states.live  # an empty state (a /health poll) holds nothing
            state.claim("r1")
            during = states.live
            assert states.get("r1") is state
        assert states.get("r1") is None and released == [state]
        return before, during, states.live, len(released)

    assert asyncio.run(scenario()) == (0, 1, 0, 1)


@pytest.mark.parametrize("ending", ["raises", "cancelled"])
def test_a_body_that_raises_or_is_cancelled_still_releases_once(ending: str) -> None:
    async def scenario() -> tuple[int, int]:
        states, released = _states()
        entered = asyncio.Event()

        async def request() -> None:
            async with states.hold() as state:
                state.claim("r1")
                entered.set()
                if ending == "raises":
                    raise ValueError("the route failed")
                await asyncio.Event().wait()

        task = asyncio.ensure_future(request())
        await entered.wait()
        if ending == "cancelled":
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return len(released), states.live

    assert asyncio.run(scenario()) == (1, 0)


def test_streams_are_closed_outermost_first_before_the_release() -> None:
    async def scenario() -> list[str]:
        order: list[str] = []
        states = RequestStates(lambda _state: order.append("released"))

        async def inner() -> AsyncGenerator[int, None]:
            try:
                yield 1
                yield 2
            finally:
                order.append("inner closed")

        async def outer(events: AsyncGenerator[int, None]) -> AsyncGenerator[int, None]:
            try:
                async for item in events:
                    yield item
            finally:
                order.append("outer closed")

        async with states.hold() as state:
            state.claim("r1")
            events = state.closes(inner())
            response = state.closes(outer(events))
            assert await anext(response) == 1  # the client left after the first item
        return order

    assert asyncio.run(scenario()) == ["outer closed", "inner closed", "released"]


def test_a_released_state_acquires_nothing() -> None:
    async def scenario() -> None:
        states, _ = _states()
        async with states.hold() as state:
            pass
        state.claim("late")

    with pytest.raises(RuntimeError, match="released"):
        asyncio.run(scenario())


def test_a_job_state_is_released_at_once_even_if_its_task_never_ran() -> None:
    """``end_now``: the release of a state no ``async with`` holds (a video job's, whose task
    may be cancelled before its first step): once, at once; a state with streams refuses it."""
    async def scenario() -> tuple[int, int, int]:
        states, released = _states()
        state = states.hold()
        state.claim("job")

        async def job() -> None:
            raise AssertionError("never runs: cancelled before its first step")

        task = asyncio.ensure_future(job())
        task.add_done_callback(lambda _task: states.end_now(state))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        states.end_now(state)  # idempotent
        streamed = states.hold()
        streamed.closes(_stream())
        with pytest.raises(RuntimeError):
            states.end_now(streamed)
        return len(released), states.live, int(states.get("job") is None)

    assert asyncio.run(scenario()) == (1, 0, 1)


async def _stream() -> AsyncGenerator[int, None]:
    yield 1
