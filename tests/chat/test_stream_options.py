"""``stream_options`` is checked as native SGLang and the OpenAI API check it, on both pipelines
that serve ``/v1/chat/completions`` (over HTTP, scripted engines): an object whose keys are
``include_usage`` and ``continuous_usage_stats`` (native's) or ``include_progress`` (Omni's,
interleaved only), each true, false or null. Anything else is a 400 naming the field, streamed
or not, before any work; a string is not taken as true."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chat.kit import CHAT, say, sse_events
from tests.kit import error_message
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server
from tests.umm.kit import HTTP

PIPELINES = {"text-only": SCRIPTED_CHAT, "interleaved": SCRIPTED_UMM}


@pytest.fixture(scope="module", params=list(PIPELINES))
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with Server(*PIPELINES[request.param]) as srv:
        yield srv


def post(server: Server, stream: bool, options: Any) -> Any:
    return HTTP.post(f"{server.url}{CHAT}", json={
        "messages": say("fine"), "stream": stream, "stream_options": options})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("options, says", [
    ({"include_usage": "invalid"}, "stream_options.include_usage: expected true or false, "
                                   "got 'invalid'"),
    ({"include_usage": "true"}, "stream_options.include_usage: expected true or false"),
    ({"include_usage": 1}, "stream_options.include_usage: expected true or false, got 1"),
    ({"continuous_usage_stats": "yes"}, "stream_options.continuous_usage_stats: expected true "
                                        "or false"),
    ({"include_progress": 0}, "stream_options.include_progress: expected true or false"),
    ({"include_usage": True, "include_useage": True}, "stream_options.include_useage: not a "
                                                      "stream option"),
    ("invalid", "stream_options: expected an object"),
    ([{"include_usage": True}], "stream_options: expected an object"),
])
def test_a_stream_option_that_is_not_a_boolean_is_refused(server: Server, stream: bool,
                                                          options: Any, says: str) -> None:
    resp = post(server, stream, options)
    assert resp.status_code == 400, resp.text
    assert error_message(resp).startswith(says)
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_continuous_usage_stats_is_refused_when_asked_for(server: Server) -> None:
    """Native sends usage on every chunk with it; Omni counts usage once, so it says so."""
    resp = post(server, True, {"continuous_usage_stats": True})
    assert resp.status_code == 400
    assert error_message(resp).startswith("stream_options.continuous_usage_stats: usage is sent "
                                          "once, on the last chunk")


@pytest.mark.parametrize("options", [{"include_usage": False}, {"include_usage": None},
                                     {"continuous_usage_stats": False}, {}, None])
def test_false_and_null_send_no_usage(server: Server, options: Any) -> None:
    resp = post(server, True, options)
    assert resp.status_code == 200, resp.text
    chunks = [e for e in sse_events(resp.text) if isinstance(e, dict)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(chunk.get("usage") is None for chunk in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_include_usage_true_is_served(server: Server, stream: bool) -> None:
    resp = post(server, stream, {"include_usage": True, "continuous_usage_stats": False})
    assert resp.status_code == 200, resp.text
    last = [e for e in sse_events(resp.text) if isinstance(e, dict)][-1] if stream \
        else resp.json()
    assert last["usage"]["total_tokens"] > 0
