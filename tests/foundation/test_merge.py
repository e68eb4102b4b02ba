"""``aio.merge``: ``merge`` and ``keep_alive`` read a stream one item ahead in a TaskGroup;
what the stream raises reaches the consumer as it is; closing or cancelling them ends the read
in flight, closes the stream and leaves no task; a cancellation is never swallowed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sglang_omni.aio.merge import keep_alive, merge

BEAT = object()


def _others() -> int:
    return len(asyncio.all_tasks()) - 1


def test_a_side_value_ready_with_the_next_item_comes_first_and_the_end_ends() -> None:
    async def main() -> list[Any]:
        side: asyncio.Queue[str] = asyncio.Queue()
        asked = asyncio.Event()

        async def events() -> AsyncIterator[str]:
            yield "a"
            await asked.wait()
            side.put_nowait("progress")  # ready in the same step as the next item
            yield "b"

        out: list[Any] = []
        async for item in merge(events(), side.get):
            out.append(item)
            asked.set()
        await asyncio.sleep(0)
        assert _others() == 0
        return out

    assert asyncio.run(main()) == ["a", "progress", "b"]


def test_what_the_stream_raises_reaches_the_consumer_unwrapped() -> None:
    async def events() -> AsyncIterator[str]:
        yield "a"
        raise ValueError("the stage died")

    async def main() -> list[str]:
        out: list[str] = []
        with pytest.raises(ValueError, match="the stage died"):
            async for item in merge(events(), asyncio.Queue[str]().get):
                out.append(item)
        await asyncio.sleep(0)
        assert _others() == 0
        return out

    assert asyncio.run(main()) == ["a"]


def test_beats_while_the_stream_is_silent_and_closing_ends_the_read_in_flight() -> None:
    closed: list[str] = []

    async def main() -> list[Any]:
        beaten = asyncio.Event()

        async def events() -> AsyncIterator[str]:
            try:
                yield "a"
                await beaten.wait()
                yield "b"
                await asyncio.Event().wait()  # a generation that never ends
            finally:
                closed.append("events")

        out: list[Any] = []
        stream = keep_alive(events(), 0.01, BEAT)
        async for item in stream:
            out.append(item)
            if item is BEAT:
                beaten.set()
            if out.count("b") and out[out.index("b"):].count(BEAT) >= 1:
                break  # a read of the endless wait is in flight
        await stream.aclose()
        await asyncio.sleep(0)
        assert _others() == 0
        return out

    out = asyncio.run(main())
    assert out[0] == "a" and BEAT in out[1:out.index("b")] and closed == ["events"]


def test_keep_alive_off_passes_the_stream_through_and_closes_it() -> None:
    closed: list[str] = []

    async def events() -> AsyncIterator[str]:
        try:
            yield "a"
            yield "b"
        finally:
            closed.append("events")

    async def main() -> list[Any]:
        stream = keep_alive(events(), 0, BEAT)
        out = [await anext(stream)]
        await stream.aclose()
        return out

    assert asyncio.run(main()) == ["a"] and closed == ["events"]


def test_a_cancelled_consumer_is_cancelled_after_the_stream_ended_even_if_cancelled_again(
) -> None:
    """The consumer's task is cancelled while it waits for an item, then again while the
    stream's cleanup still runs (a cancel scope repeats its cancellation): the stream's cleanup
    runs to its end before the cancellation reaches the consumer, and no task is left."""
    order: list[str] = []

    async def main() -> None:
        reading, cleaning, cleaned = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def events() -> AsyncIterator[str]:
            try:
                reading.set()
                await asyncio.Event().wait()
                yield "never"
            finally:
                cleaning.set()
                await cleaned.wait()  # cleanup that awaits
                order.append("stream ended")

        async def consume() -> None:
            try:
                async for _ in merge(events(), asyncio.Queue[str]().get):
                    pass
            except asyncio.CancelledError:
                order.append("consumer cancelled")
                raise

        consumer = asyncio.create_task(consume())
        await reading.wait()
        consumer.cancel()
        await cleaning.wait()
        consumer.cancel()  # again, while the stream cleans up
        await asyncio.sleep(0)
        cleaned.set()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert _others() == 0

    asyncio.run(main())
    assert order == ["stream ended", "consumer cancelled"]
