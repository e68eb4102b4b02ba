"""One state per request: everything a request holds in the server, released in one place.

A :class:`RequestState` (from :meth:`RequestStates.hold`) is an async context manager whose
exit is the request's only release: the HTTP layer enters it around the whole exchange (the
route and its response, a stream included), so however the request ends (answered, refused,
failed, its client gone, its task cancelled at shutdown) the exit runs once, on the event loop.
What the request acquires on the way is recorded on its state (:meth:`RequestState.claim`,
``ticket``, ``run`` and the rest) and the owner's release undoes it all; nothing else releases
any of it.

A state is *live* from its first acquisition (its request id or its admission ticket) until
its release; :attr:`RequestStates.live` counts them (``sgl_omni_request_states``), and a
server at rest has none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sglang_omni.aio.race import to_the_end
from sglang_omni.errors import OmniError

if TYPE_CHECKING:
    from sglang_omni.pipeline.admission import Ticket
    from sglang_omni.pipeline.admission.media_budget import MediaReservation
    from sglang_omni.pipeline.progress import RunProgress
    from sglang_omni.pipeline.reasoner_media import ReasonerMedia
    from sglang_omni.pipeline.scheduling import PlanEntry
    from sglang_omni.pipeline.umm import UMMRun

log = logging.getLogger("sglang_omni.request_state")
S = TypeVar("S", bound=AsyncIterable[Any])


class Doom:
    """Set when a stage an admitted request depends on died, or the server ended it at
    shutdown; its dispatches then fail with ``error``."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.error: OmniError | None = None

    def fail(self, error: OmniError) -> None:
        if self.error is None:
            self.error = error
            self.event.set()


class RequestState:
    """What one request holds; filled in as it acquires things, emptied by its owner's release
    alone (see the module docstring)."""

    def __init__(self, owner: RequestStates) -> None:
        self._owner = owner
        #: The request id, once claimed (``RequestIds``); its end is ``finish`` or, when the
        #: request was refused before any work, ``forget`` (``refused``).
        self.rid: str | None = None
        self.refused = False
        #: Its admission ticket (``pipeline.admission``: text chat's, or the direct queue's
        #: turn on the generation stage).
        self.ticket: Ticket | None = None
        #: The interleaved run, its place in the deadline plan, its progress events, its doom
        #: (a dead stage or shutdown), and its media as its Reasoner turns send them.
        self.run: UMMRun | None = None
        self.plan: PlanEntry | None = None
        self.progress: RunProgress | None = None
        self.doom: Doom | None = None
        self.media: ReasonerMedia | None = None
        #: Its bytes in the server's client media budget
        #: (``pipeline.admission.media_budget``),
        #: released once it is answered (``mark_answered``), or with the state.
        self.media_hold: MediaReservation | None = None
        #: Whether a Reasoner stage saw the request (it is told the request ended).
        self.on_reasoner = False
        #: The iterators the response reads, closed first at release, the last one given
        #: (the outermost) first: that cancels a dispatch still running, which aborts it on
        #: its stage.
        self.streams: list[AsyncIterable[Any]] = []
        #: The response's last byte was handed to the server (``mark_answered``).
        self.answered = False
        self.released = False

    async def __aenter__(self) -> RequestState:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._owner._end(self)

    def claim(self, rid: str) -> None:
        """Record the request id (claimed from ``RequestIds`` by the owner); the state is
        live from now on, and found by its id."""
        self._check_open()
        self.rid = rid
        self._owner._register(self)

    def take(self, ticket: Ticket | None) -> None:
        """Record an admission ticket; the state is live from now on."""
        self._check_open()
        self.ticket = ticket
        self._owner._register(self)

    def mark_answered(self) -> None:
        """The response's last byte is being handed to the server: from now on the request no
        longer counts against admission (the owner's ``answered``), since its client may
        already be sending its next request while the release (which may wait for the loop,
        closing a stream) is still to come."""
        if not self.answered and not self.released:
            self.answered = True
            self._owner._answered(self)

    def _check_open(self) -> None:
        if self.released:
            raise RuntimeError("a released request state cannot acquire anything")

    def closes(self, stream: S) -> S:
        """``stream``, closed when the request is released (before anything else is; a stream
        given later, one that reads this one, is closed before it)."""
        self.streams.insert(0, stream)
        return stream


class RequestStates:
    """The live request states, by id; ``release(state)`` undoes what a state holds (the
    owner's; called only by :meth:`hold`'s exit); ``answered(state)`` ends, once the
    response is out, what counts the request against admission (idempotent parts of the
    release, which runs them again)."""

    def __init__(self, release: Callable[[RequestState], None],
                 answered: Callable[[RequestState], None] | None = None) -> None:
        self._release = release
        self._answered = answered or (lambda _state: None)
        self._live: set[RequestState] = set()
        self._by_rid: dict[str, RequestState] = {}

    @property
    def live(self) -> int:
        """States holding something now (a server at rest has none)."""
        return len(self._live)

    def __iter__(self) -> Iterator[RequestState]:
        return iter(list(self._live))

    def get(self, rid: str) -> RequestState | None:
        return self._by_rid.get(rid)

    def hold(self) -> RequestState:
        """A new request's state, to ``async with``: the exit is its one release (see the
        module docstring)."""
        return RequestState(self)

    def _register(self, state: RequestState) -> None:
        self._live.add(state)
        if state.rid is not None:
            self._by_rid[state.rid] = state

    def end_now(self, state: RequestState) -> None:
        """Release ``state`` at once (idempotent), for a state its owner does not ``async
        with`` (a job that runs on after its answer, whose task may end before it ran):
        such a state gives no streams to close."""
        if state.released:
            return
        if state.streams:
            raise RuntimeError("a request state with streams is released by its async with")
        state.released = True
        self._forget(state)

    async def _end(self, state: RequestState) -> None:
        if state.released:
            return
        state.released = True
        cancelled = False
        try:
            for stream in state.streams:
                try:
                    await _close(stream)
                except asyncio.CancelledError:
                    cancelled = True  # each stream still closes to its end; raised after
            if cancelled:
                raise asyncio.CancelledError()
        finally:
            self._forget(state)

    def _forget(self, state: RequestState) -> None:
        """The end of every release: the state is no longer live, and its owner undoes what
        it holds."""
        self._live.discard(state)
        if state.rid is not None and self._by_rid.get(state.rid) is state:
            del self._by_rid[state.rid]
        self._release(state)


async def _close(stream: AsyncIterable[Any]) -> None:
    """Close ``stream`` (an async generator; another iterator is left as it is); a failure
    while it closes is logged (the release goes on)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None or getattr(stream, "ag_frame", True) is None:
        return  # not a generator, or one that ended: nothing to await, so the release does
        # not yield to the loop (a client that has its answer may already be sending the next
        # request, which must find this one's admission released)
    try:
        await to_the_end(aclose())
    except Exception:  # noqa: BLE001 - the release must go on
        log.exception("a request's stream failed as it was closed")
