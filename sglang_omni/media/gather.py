"""Reading all the media of one request: a few at a time, within one deadline for them all.

:func:`load_all` reads every ``(label, ref)`` with :func:`~sglang_omni.media.fetch.load_bytes`,
at most :data:`FETCH_CONCURRENCY` at once (and at most :data:`PROCESS_FETCHES` in the process,
all requests together), and fails when they take longer together than the
policy's ``request_deadline_s`` (``--server.media_request_deadline_s``): four parts trickled
over 24 s each take about 24 s, not 96, and 32 parts just under the per-fetch deadline hold the
request's admission slot for at most the request deadline, not 32 per-fetch deadlines.

The first part that fails fails the whole read (the others are cancelled, their bytes dropped),
with that part's error, as one failed fetch fails a request. A request over its deadline fails
like a fetch that times out: :class:`~sglang_omni.errors.MediaFetchFailed` (500) naming the
setting.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from sglang_omni.errors import MediaFetchFailed
from sglang_omni.media.fetch import REASON_ATTR, load_bytes, read_media
from sglang_omni.media.inline import InlinePayload
from sglang_omni.media.policy import MediaPolicy
from sglang_omni.media.stats import MEDIA_STATS
from sglang_omni.media.workdir import RequestMediaDir

#: Parts of one request read at once. Four lets the parts of a typical request (a few images)
#: come in about the time of the slowest, while one request opens at most four connections to
#: media hosts (max_active requests: 128), and a request's parts are held until it ends anyway.
FETCH_CONCURRENCY = 4
T = TypeVar("T")
#: Fetches one process runs at once, all requests together (first come, first served). The
#: fetches share the process's event loop and the link: more at once would only slow each one
#: down, toward its own deadline, so that a burst of requests all fail together instead of the
#: first ones ending. Sixteen fetches at the 64 MiB limit are 1 GiB in flight.
PROCESS_FETCHES = 16
#: The flag of the request-wide deadline, for messages.
REQUEST_DEADLINE_FLAG = "--server.media_request_deadline_s"


async def load_all(refs: Sequence[tuple[str, str]], policy: MediaPolicy,
                   workdir: RequestMediaDir, *, deadline_s: float | None = None,
                   concurrency: int = FETCH_CONCURRENCY) -> list[bytes]:
    """The bytes of every ``(label, ref)``, in order (see the module contract). ``deadline_s``:
    the seconds left of the request's deadline (the policy's ``request_deadline_s`` when
    None); each fetch keeps its own limits too."""
    return await gather_within(
        [(label, functools.partial(load_bytes, ref, policy, workdir, label=label))
         for label, ref in refs], policy, deadline_s=deadline_s, concurrency=concurrency)


async def read_all(refs: Sequence[tuple[str, str]], policy: MediaPolicy,
                   workdir: RequestMediaDir, *, deadline_s: float | None = None,
                   concurrency: int = FETCH_CONCURRENCY) -> list[bytes | InlinePayload]:
    """:func:`load_all` with :func:`~sglang_omni.media.fetch.read_media`: inline data is its
    checked payload, not decoded."""
    return await gather_within(
        [(label, functools.partial(read_media, ref, policy, workdir, label=label))
         for label, ref in refs], policy, deadline_s=deadline_s, concurrency=concurrency)


async def gather_within(calls: Sequence[tuple[str, Callable[[], Awaitable[T]]]],
                        policy: MediaPolicy, *, deadline_s: float | None = None,
                        concurrency: int = FETCH_CONCURRENCY) -> list[T]:
    """The results of every ``(label, call)`` (a read of the medium at ``label``), in order,
    run as :func:`load_all` runs its reads: at most ``concurrency`` at once, within
    ``deadline_s`` (the policy's ``request_deadline_s`` when None), the first failure failing
    them all."""
    if not calls:
        return []
    limit = policy.request_deadline_s if deadline_s is None else deadline_s
    done: list[bool] = [False] * len(calls)
    results: dict[int, T] = {}
    failures: list[BaseException] = []
    slots = anyio.Semaphore(max(1, concurrency))
    shared = _process_slots()

    async def one(index: int, call: Callable[[], Awaitable[T]], scope: anyio.CancelScope
                  ) -> None:
        async with slots, shared:
            try:
                results[index] = await call()
                done[index] = True
            except Exception as exc:  # noqa: BLE001 - the first failure fails them all
                failures.append(exc)
                scope.cancel()

    try:
        with anyio.fail_after(limit):
            async with anyio.create_task_group() as group:
                for index, (_, call) in enumerate(calls):
                    group.start_soon(one, index, call, group.cancel_scope)
    except TimeoutError:
        MEDIA_STATS.refused("timeout")
        waiting = next(label for (label, _), ended in zip(calls, done, strict=True)
                       if not ended)
        raise _timeout(waiting, policy, limit) from None
    if failures:
        raise failures[0]
    return [results[index] for index in range(len(calls))]


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
    weakref.WeakKeyDictionary()


def _process_slots() -> asyncio.Semaphore:
    """The running loop's :data:`PROCESS_FETCHES` slots (asyncio's semaphore: FIFO)."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(PROCESS_FETCHES)
    return slots


def _timeout(label: str, policy: MediaPolicy, limit: float) -> MediaFetchFailed:
    exc = MediaFetchFailed(
        f"{label}: fetching the request's media took longer than {limit:g} s (all its parts "
        f"together; the server allows {policy.request_deadline_s:g} s: "
        f"{REQUEST_DEADLINE_FLAG}); name media a faster host serves, or raise the limit")
    setattr(exc, REASON_ATTR, "timeout")
    return exc
