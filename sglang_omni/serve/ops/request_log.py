"""One record per HTTP request: counted in the metrics and logged as one line when it ends.

:class:`RequestRecorder` (pure ASGI, outermost) opens a :class:`RequestRecord` for every HTTP
request and makes it the current one (:func:`current_record`, a context variable, so the route
and the stream generators it starts reach it without being handed it). The route fills in what
only it knows: the request id, the interleaved run (its Reasoner turns and generations), when the
first segment went out, and the error a stream reported after its 200 (:func:`note_failure`).
When the response ends the recorder counts it and logs one line on ``sglang_omni.access``:
``request rid=... route=... status=... outcome=... turns=... generations=... bytes=...
duration_s=... timeline=...`` (with ``--log-format json`` the same fields as JSON keys; the
timeline of an interleaved request is ``span:seconds,...``, see ``pipeline.timeline``, and a JSON
object there).

Polls and static assets (:mod:`.service_paths`) are counted but not logged, nor counted as
requests being served; ``sgl-omni serve --log-polls`` logs them (:class:`PollFilter` keeps them
out of uvicorn's access log otherwise). A route's label is its template; a request no route
matched is :data:`UNMATCHED`.

``status`` is the HTTP status, or for a stream that failed after its 200 the code of its error
event; a client that left before the answer ended gets nginx's "client closed request" status
(:data:`~sglang_omni.serve.wire.http_errors.CLIENT_CLOSED_REQUEST`).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_omni.serve.ops.service_paths import is_poll
from sglang_omni.serve.wire.http_errors import CLIENT_CLOSED_REQUEST

log = logging.getLogger("sglang_omni.access")

#: The route label of a request no route matched (a 404), so scanners cannot add labels.
UNMATCHED = "unmatched"


@dataclass
class RequestRecord:
    """What one request did; see the module docstring."""

    method: str
    path: str
    started: float = field(default_factory=time.monotonic)
    rid: str | None = None
    status: int | None = None
    #: Set when a stream reported an error after its 200: the error's status.
    failed_status: int | None = None
    first_segment_s: float | None = None
    segments: int = 0
    bytes_sent: int = 0
    completed: bool = False
    #: The interleaved run (``pipeline.umm.UMMRun``), for its turns and generations.
    run: Any = None

    def segment_sent(self) -> None:
        self.segments += 1
        if self.first_segment_s is None:
            self.first_segment_s = time.monotonic() - self.started

    def final_status(self) -> int:
        if self.failed_status is not None:
            return self.failed_status
        if self.status is None or not self.completed:
            return CLIENT_CLOSED_REQUEST
        return self.status

    def timeline(self, duration_s: float) -> dict[str, float] | None:
        """Where an interleaved request's seconds went (``pipeline.timeline``), else None."""
        timeline = getattr(getattr(self.run, "state", None), "timeline", None)
        return None if timeline is None else timeline.breakdown(duration_s)

    def turns_and_generations(self) -> tuple[int | None, int | None]:
        state = getattr(self.run, "state", None)
        if state is None:
            return None, None
        return state.dispatches - state.generations, state.generations


_CURRENT: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "omni_request_record", default=None)


def current_record() -> RequestRecord | None:
    """The record of the request being served in this context (None outside one)."""
    return _CURRENT.get()


def note_rid(rid: str) -> None:
    record = _CURRENT.get()
    if record is not None:
        record.rid = rid


def note_run(run: Any) -> None:
    record = _CURRENT.get()
    if record is not None:
        record.run = run


def note_segment() -> None:
    record = _CURRENT.get()
    if record is not None:
        record.segment_sent()


def note_failure(status: int) -> None:
    """A stream failed after its 200 with an error of ``status``."""
    record = _CURRENT.get()
    if record is not None:
        record.failed_status = status


class RequestSink(Protocol):
    """Where requests are counted (the server's metrics). ``in_flight`` moves the gauge of
    requests being served (quiet paths left out); ``request_ended`` counts every request."""

    def in_flight(self, delta: int) -> None: ...

    def request_ended(self, route: str, record: RequestRecord, status: int,
                      duration_s: float) -> None: ...


def outcome_of(status: int) -> str:
    if status == CLIENT_CLOSED_REQUEST:
        return "client_closed"
    return "ok" if status < 400 else "refused" if status < 500 else "failed"


def log_fields(route: str, record: RequestRecord, status: int,
               duration_s: float) -> dict[str, Any]:
    """The fields of a request's log line, in order."""
    turns, generations = record.turns_and_generations()
    return {"rid": record.rid, "method": record.method, "route": route, "status": status,
            "outcome": outcome_of(status), "turns": turns, "generations": generations,
            "segments": record.segments, "bytes": record.bytes_sent,
            "duration_s": round(duration_s, 3),
            "first_segment_s": None if record.first_segment_s is None
            else round(record.first_segment_s, 3),
            "timeline": record.timeline(duration_s)}


class PollFilter(logging.Filter):
    """Drops uvicorn's access-log lines of polls (:func:`~.service_paths.is_poll`); install it
    with :func:`quiet_polls`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access: (client address, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            return not is_poll(args[2].partition("?")[0])
        return True


def quiet_polls(logger_name: str = "uvicorn.access") -> None:
    """Keep polls out of uvicorn's access log (once per process)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, PollFilter) for f in logger.filters):
        logger.addFilter(PollFilter())


class RequestRecorder:
    """Pure ASGI: a record per HTTP request, counted and logged when the response ends."""

    def __init__(self, app: ASGIApp, sink: RequestSink,
                 clock: Callable[[], float] = time.monotonic, log_polls: bool = False) -> None:
        self.app = app
        self.sink = sink
        self.clock = clock
        #: Log polls too (``--log-polls``); they are counted in the metrics either way.
        self.log_polls = log_polls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(scope.get("method", ""), scope.get("path", ""),
                               started=self.clock())
        token = _CURRENT.set(record)
        quiet = is_poll(record.path)
        if not quiet:
            self.sink.in_flight(1)

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            elif message["type"] == "http.response.body":
                record.bytes_sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    record.completed = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            _CURRENT.reset(token)
            if not quiet:
                self.sink.in_flight(-1)
            try:
                self._end(scope, record, quiet)
            finally:
                # A task started inside the request (a planner's ticker) copied its context, so
                # it may keep the record for long: keep the request's run (and the media it
                # holds) out of it once counted and logged.
                record.run = None

    def _end(self, scope: Scope, record: RequestRecord, quiet: bool) -> None:
        route = getattr(scope.get("route"), "path", None) or UNMATCHED
        status = record.final_status()
        duration = self.clock() - record.started
        self.sink.request_ended(route, record, status, duration)
        if quiet and not self.log_polls:
            return
        fields = log_fields(route, record, status, duration)
        log.info("request %s", " ".join(f"{k}={_text(v)}" for k, v in fields.items()),
                 extra={"omni_fields": fields})


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):  # the timeline: span:seconds,...
        return ",".join(f"{k}:{v:g}" for k, v in value.items()) or "-"
    text = str(value)
    return text if text and not any(c.isspace() or c == '"' for c in text) else repr(text)
