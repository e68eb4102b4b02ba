"""The server-wide body budget (``server.max_pending_body_bytes``): bodies being read and
parsed at once are bounded together; one that does not fit beside the others is refused with
503 before it is buffered, and a body whose client leaves gives its share back."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from sglang_omni.errors import ServiceUnavailable
from sglang_omni.serve.body_budget import BodyBudget
from tests.server import SCRIPTED_UMM, Server
from tests.wire.kit import connect, error_of, post_raw

BUDGET = 1_000_000
FLAGS = ["--server.max_body_bytes", "1048576", "--server.max_pending_body_bytes", str(BUDGET),
         "--server.body_timeout_s", "10"]


def test_a_lease_holds_what_its_body_covers_and_gives_it_back() -> None:
    budget = BodyBudget(100)
    with budget.lease() as first:
        first.cover(60)
        first.cover(40)  # less than held: nothing more taken
        assert budget.held == 60
        with budget.lease() as second:
            second.cover(30)
            second.cover(40)  # a chunked body growing
            assert budget.held == 100
            with pytest.raises(ServiceUnavailable) as refused:
                budget.lease().cover(1)
            assert "server.max_pending_body_bytes" in refused.value.message
            assert budget.held == 100  # a refused body takes nothing
        assert budget.held == 60
    assert budget.held == 0
    with budget.lease() as alone:  # a body alone always fits, whatever its size
        alone.cover(500)
        alone.close()
        alone.close()
    assert budget.held == 0


@pytest.fixture(scope="module")
def budgeted() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *FLAGS) as server:
        yield server


def refused_prompt(size: int) -> bytes:
    """A body of ``size`` bytes the route refuses with 400 once parsed (prompt not a string)."""
    head, tail = b'{"prompt": 1', b"}"
    return head + b" " * (size - len(head) - len(tail)) + tail


def hold_upload(url: str, size: int) -> socket.socket:
    """A client that declared a ``size``-byte body and sent only its first bytes."""
    sock = connect(url)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(size).encode() + b"\r\n\r\n" + b'{"prompt": ')
    return sock


def status_within(url: str, body: bytes, want: int, limit_s: float = 10.0) -> httpx.Response:
    """POST ``body`` until it is answered ``want`` (the server takes the held upload's lease
    when it starts reading that body); the last answer."""
    deadline = time.monotonic() + limit_s
    while True:
        resp = post_raw(f"{url}/generate", body)
        if resp.status_code == want or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def test_a_body_that_does_not_fit_beside_others_waits_for_them(budgeted: Server) -> None:
    url = budgeted.url
    held = hold_upload(url, 800_000)
    try:
        resp = status_within(url, refused_prompt(500_000), 503)
        assert resp.status_code == 503
        error = error_of(resp)
        assert "server.max_pending_body_bytes" in error["message"]
        assert "0.8 MiB of other request bodies" in error["message"]
        assert int(resp.headers["retry-after"]) > 0
        small = post_raw(f"{url}/generate", refused_prompt(1_000))  # fits beside the held one
        assert small.status_code == 400, small.text
    finally:
        held.close()  # its client leaves mid-body
    # Its share is given back: the body that was refused fits now, and so does one alone that
    # is larger than the budget (max_body_bytes allows it).
    assert status_within(url, refused_prompt(500_000), 400).status_code == 400
    assert post_raw(f"{url}/generate", refused_prompt(1_040_000)).status_code == 400
