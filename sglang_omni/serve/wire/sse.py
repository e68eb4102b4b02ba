"""Server-sent events framing (written by hand: the format is two lines and we need exact
control of event names and the closing ``[DONE]``).

Data is JSON with every non-ASCII character escaped: SSE ends lines only at CR and LF, but
common line readers (``str.splitlines``, httpx's ``iter_lines``, the SDK) also split at U+2028,
U+2029, NEL and other separators, which would cut a raw answer holding them in two.

Every SSE response goes through :func:`sse_response`: while the stream has nothing to send (a
long generation), it sends the comment :data:`SSE_KEEPALIVE` every ``server.sse_keepalive_s``
seconds, so proxies that cut idle connections leave it open. Every stream ends with ``[DONE]``,
after its error whatever is raised (:func:`ends_with_done`, framed by :func:`failed_end`, the
one home of that rule); :func:`stream_error` turns an unexpected exception into the generic
500 (its traceback is logged, its text never sent).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from sglang_omni.aio.merge import keep_alive
from sglang_omni.errors import OmniError, ServerError
from sglang_omni.serve.ops.request_log import note_failure
from sglang_omni.serve.wire.http_errors import GENERIC_500
from sglang_omni.serve.wire.wire_json import dumps

log = logging.getLogger("sglang_omni.serve")

SSE_DONE = "data: [DONE]\n\n"
#: How a stream frames its error: ``event: error`` holding the error object (``/generate``), or
#: a data line holding the error body (the OpenAI chat routes).
ERROR_EVENT, ERROR_DATA = "event", "data"
SSE_KEEPALIVE = ": keep-alive\n\n"
#: Headers of every SSE response: no caching, no proxy buffering (nginx honours the latter).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(obj: Any) -> str:
    return f"data: {dumps(obj)}\n\n"


def sse_event(event: str, obj: Any) -> str:
    return f"event: {event}\ndata: {dumps(obj)}\n\n"


def stream_error(exc: Exception, rid: str | None = None) -> OmniError:
    """The error a stream reports for ``exc``: itself if an OmniError, else the generic 500
    (the traceback is logged here; the exception's text is never sent). The request's record
    (:mod:`.request_log`) takes its status."""
    if isinstance(exc, OmniError):
        note_failure(exc.status)
        return exc
    log.error("stream of request %s failed unexpectedly", rid or "?", exc_info=exc)
    note_failure(ServerError.status)
    return ServerError(GENERIC_500)


def error_frame(exc: OmniError, framing: str) -> str:
    """``exc`` framed as :data:`ERROR_EVENT` or :data:`ERROR_DATA` says."""
    if framing == ERROR_EVENT:
        return sse_event("error", exc.to_body()["error"])
    return sse_data(exc.to_body())


def failed_end(exc: OmniError, framing: str) -> str:
    """The end of a stream that failed after it started: its error, then ``[DONE]``."""
    return error_frame(exc, framing) + SSE_DONE


async def ends_with_done(events: AsyncGenerator[str, None], framing: str,
                         rid: str | None = None) -> AsyncIterator[str]:
    """``events``, then ``[DONE]``; whatever ``events`` raises is sent first as its error
    (:func:`stream_error`, framed by ``framing``). Closing this closes ``events``."""
    try:
        try:
            async for item in events:
                yield item
        except Exception as exc:  # noqa: BLE001 - every stream ends with an error and [DONE]
            yield error_frame(stream_error(exc, rid), framing)
    finally:
        await events.aclose()
    yield SSE_DONE


def with_keepalive(events: AsyncIterator[str], interval_s: float) -> AsyncGenerator[str, None]:
    """``events``, with :data:`SSE_KEEPALIVE` sent whenever nothing came for ``interval_s``
    seconds (``<= 0``: never). Closing or cancelling this iterator cancels the pending read of
    ``events`` and closes it, so no task outlives the response
    (:func:`~sglang_omni.aio.merge.keep_alive`)."""
    return keep_alive(events, interval_s, SSE_KEEPALIVE)


def sse_response(events: AsyncIterator[str], keepalive_s: float) -> StreamingResponse:
    """The ``text/event-stream`` response for ``events``, with keep-alive comments. What the
    request holds is released by its request state when the response ends
    (``serve.request_states``), not by the response."""
    return StreamingResponse(with_keepalive(events, keepalive_s), media_type="text/event-stream",
                             headers=SSE_HEADERS)
