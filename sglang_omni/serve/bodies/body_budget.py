"""The server-wide budget of request-body bytes being read and parsed at once.

``server.max_body_bytes`` bounds one body; this bounds them all together, so that no client can
make the server hold more than ``server.max_pending_body_bytes`` of bodies it is still reading
or parsing (many connections each sending a body of the largest size would otherwise take
gigabytes, as raw bytes, then as text and parsed values).

Every route's body goes through :func:`~sglang_omni.serve.bodies.body_formats.read_route_body`,
which
takes a :class:`BodyLease` for the request while it reads and parses the body (``with``); the
reader (:func:`~sglang_omni.serve.bodies.request_body.read_body`) covers the body's declared
Content-Length before reading it, and a body without one as its bytes arrive. A body that does
not fit beside the others being read is refused with 503 (Retry-After) before it is buffered,
unless no other body is being read (one body up to ``max_body_bytes`` always fits). The lease
ends when the body is parsed, refused, or abandoned by its client. Use from the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from sglang_omni.errors import ServiceUnavailable


class BodyBudget:
    """``capacity`` bytes of request bodies being read at once; ``held`` is what leases hold;
    ``on_refused`` (when set) is called for each body refused."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.on_refused: Callable[[], None] | None = None

    def lease(self) -> BodyLease:
        return BodyLease(self)


class BodyLease:
    """One request's share of a :class:`BodyBudget`; ``close()`` (or leaving ``with``) gives
    it back. Closing twice is harmless."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held = 0

    def cover(self, size: int) -> None:
        """Hold ``size`` bytes in all for this body (only what is not held yet is taken);
        ServiceUnavailable when they do not fit beside the other bodies being read."""
        more = size - self.held
        if more <= 0:
            return
        budget = self.budget
        others = budget.held - self.held
        if others > 0 and budget.held + more > budget.capacity:
            if budget.on_refused is not None:
                budget.on_refused()
            raise ServiceUnavailable(
                f"the server is reading {others} bytes of other request bodies and this one "
                f"({size} bytes) does not fit beside them within server.max_pending_body_bytes "
                f"({budget.capacity}); retry shortly, or raise the limit")
        budget.held += more
        self.held = size

    def resize(self, size: int) -> None:
        """Hold exactly ``size`` bytes: less gives the rest back at once, more is taken as
        :meth:`cover` takes it (ServiceUnavailable when it does not fit)."""
        if size >= self.held:
            self.cover(size)
            return
        self.budget.held -= self.held - size
        self.held = size

    def close(self) -> None:
        self.budget.held -= self.held
        self.held = 0

    def __enter__(self) -> BodyLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
