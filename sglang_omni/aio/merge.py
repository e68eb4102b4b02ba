"""``merge`` and ``keep_alive``: an async iterator read one item ahead beside something else.

Both read ``events`` one item at a time (the next read starts once the consumer asked for the
next item) in a task of an :class:`asyncio.TaskGroup`, racing it against a side source
(:func:`merge`: a progress queue) or an idle timer (:func:`keep_alive`: the keep-alive of a
stream). The group owns every task they start: none outlives the iterator.

Ending (the consumer closes the iterator, or its task is cancelled while it waits for an item):
the read in flight is cancelled (the ``CancelledError`` it raises inside ``events`` ends that
iterator) and waited for to its end even when the caller is cancelled again meanwhile (a cancel
scope, such as the one a streaming response's client disconnect cancels, repeats its
cancellation: returning earlier left ``events`` running in the read's task, and its owner then
closing it failed with "aclose(): asynchronous generator is already running"). ``events`` is
then closed; the caller's cancellation is raised once it ended.

``events`` ending ends the iterator; what ``events`` raises is raised to the consumer as it is
(never wrapped in an exception group: the group's tasks hand outcomes over, they never fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from sglang_omni.aio.race import to_the_end

T = TypeVar("T")
S = TypeVar("S")
B = TypeVar("B")


def merge(events: AsyncIterator[T], side: Callable[[], Awaitable[S]]
          ) -> AsyncGenerator[T | S, None]:
    """``events`` with the values of ``side()`` in between, as they come (``side`` is called
    again after each value, e.g. ``queue.get``); a side value that is ready with the next item
    of ``events`` comes first. Ends when ``events`` ends (see the module docstring)."""
    return _merged(events, side, 0.0, None)


def keep_alive(events: AsyncIterator[T], every_s: float, beat: B
               ) -> AsyncGenerator[T | B, None]:
    """``events``, with ``beat`` yielded whenever nothing came for ``every_s`` seconds since
    the latest item or beat (``every_s <= 0``: never, and ``events`` is passed through without
    a task). Ends when ``events`` ends (see the module docstring)."""
    if every_s <= 0:
        return _passed(events)
    return _merged(events, None, every_s, beat)


async def _passed(events: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    try:
        async for item in events:
            yield item
    finally:
        await _close(events)


async def _outcome(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """``(True, value)`` or ``(False, exception)``: a task of the group never fails (a failed
    child would cancel the consumer's task and wrap the error in an exception group)."""
    try:
        return True, await awaitable
    except Exception as exc:  # noqa: BLE001 - handed to the consumer (StopAsyncIteration too)
        return False, exc


async def _merged(events: AsyncIterator[Any], side: Callable[[], Awaitable[Any]] | None,
                  idle_s: float, beat: Any) -> AsyncGenerator[Any, None]:
    raised: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            read: asyncio.Task[tuple[bool, Any]] | None = None
            waiting: asyncio.Task[tuple[bool, Any]] | None = None
            try:
                while True:
                    if read is None:
                        read = group.create_task(_outcome(anext(events)))
                    if side is not None and waiting is None:
                        waiting = group.create_task(_outcome(side()))
                    await asyncio.wait({read} if waiting is None else {read, waiting},
                                       timeout=idle_s if idle_s > 0 else None,
                                       return_when=asyncio.FIRST_COMPLETED)
                    if waiting is not None and waiting.done():
                        ok, value = waiting.result()
                        waiting = None
                        if not ok:
                            raised = value
                            break
                        yield value
                        continue
                    if not read.done():
                        yield beat
                        continue
                    ok, value = read.result()
                    read = None
                    if not ok:  # the outcome is dropped: its traceback would keep this frame
                        raised = None if isinstance(value, StopAsyncIteration) else value
                        break
                    yield value
                    del value
            except (Exception, GeneratorExit) as exc:  # raised past the group, as it is
                raised = exc
            finally:
                for task in (read, waiting):
                    if task is not None:
                        task.cancel()
                read = waiting = value = None
    except asyncio.CancelledError as exc:
        # Python 3.11's TaskGroup raises it from a frame that holds it in a local: the
        # traceback would make a cycle keeping this frame (and the whole response) alive
        # until a full garbage collection.
        exc.__traceback__ = None
        raise
    finally:
        try:
            await _close(events)
        except BaseException:
            raised = None  # (a cancellation): no cycle through this frame either
            raise
    if raised is not None:
        try:
            raise raised
        finally:  # the exception's traceback holds this frame: no cycle back through a local
            raised = None


async def _close(events: AsyncIterator[Any]) -> None:
    """Close ``events`` (a no-op if it ended), to the end even if the caller is cancelled
    meanwhile (whose cancellation is raised then)."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await to_the_end(aclose())
