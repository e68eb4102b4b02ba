"""The server-wide client media budget and the request-wide media fetch, over HTTP: a real
server with scripted stages fetching from a loopback host whose answers wait at a gate the
test opens (``gate_host``), so every step syncs on what the host saw or on the
``sgl_omni_client_media_bytes`` gauge, never on time.

``budget``: ``--server.max_media_bytes 1000000`` (a request naming a remote part reserves
1,000,000 bytes before it fetches) and ``--server.max_client_media_bytes 1500000`` (one such
request fits, two do not). ``deadline``: ``--server.media_request_deadline_s 1`` with each
fetch allowed far longer. ``fetching``: the default deadlines (the test of concurrent fetches
opens the gate once four wait there: under a 1 s request deadline, a loaded machine ran the
deadline out before the fetches reached the gate).
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.kit import error_message, wait_for
from tests.media.media_http_server import PNG
from tests.media_http.gate_host import GateHost, gate_host
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server

RESERVED = 1_000_000
BUDGET = 1_500_000
FLAGS = ("--allowed-media-domain", "127.0.0.1")


@pytest.fixture(scope="module")
def host() -> Iterator[GateHost]:
    with gate_host() as running:
        yield running


@pytest.fixture(scope="module")
def budget() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *FLAGS, "--server.max_media_bytes", str(RESERVED),
                "--server.max_client_media_bytes", str(BUDGET)) as srv:
        yield srv


@pytest.fixture(scope="module")
def deadline() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *FLAGS, "--server.media_request_deadline_s", "1",
                "--server.media_fetch_deadline_s", "600",
                "--server.media_fetch_timeout_s", "600") as srv:
        yield srv


@pytest.fixture(scope="module")
def fetching() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def text_only() -> Iterator[Server]:
    with Server(*SCRIPTED_CHAT, *FLAGS, "--server.max_media_bytes", str(RESERVED),
                "--server.max_client_media_bytes", str(BUDGET)) as srv:
        yield srv


@pytest.fixture(autouse=True)
def fresh(host: GateHost) -> Iterator[None]:
    host.reset()
    yield
    host.open.set()  # nothing a test left waits on


def body(*urls: str, script: list | None = None, stream: bool = False) -> dict:
    entries = script or [{"action": "final", "text": "{media}"}]
    content: list[dict] = [{"type": "text",
                            "text": f"<omni-script>{json.dumps(entries)}</omni-script>"}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": content}], "stream": stream}


def held(server: Server) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("sgl_omni_client_media_bytes "):
            return float(line.split()[1])
    raise AssertionError("no sgl_omni_client_media_bytes gauge in /metrics")


def stage_media(server: Server) -> float:
    """The media bytes the Reasoner stage holds for its requests (its last heartbeat's)."""
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith('sgl_omni_stage_request_media_bytes{stage="reasoner"}'):
            return float(line.split()[1])
    return 0.0


def released(server: Server) -> None:
    """Wait until the running requests hold no client media bytes."""
    wait_for(lambda: held(server) == 0, timeout=60)


def in_background(client: httpx.Client, server: Server, payload: dict
                  ) -> tuple[list[httpx.Response], threading.Thread]:
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(client.post(
        f"{server.url}/v1/chat/completions", json=payload, timeout=120)), daemon=True)
    thread.start()
    return out, thread


def test_a_request_over_the_budget_gets_503_before_any_fetch(budget: Server,
                                                              host: GateHost) -> None:
    released(budget)
    with httpx.Client() as client:
        first, thread = in_background(client, budget, body(host.url("/gate/first")))
        assert host.wait(lambda h: "/gate/first" in h.paths)
        assert held(budget) == RESERVED  # reserved before the fetch began
        queue = httpx.get(f"{budget.url}/v1/queue", timeout=10).json()
        assert (queue["client_media_bytes"], queue["max_client_media_bytes"]) == (RESERVED,
                                                                                BUDGET)
        refused = httpx.post(f"{budget.url}/v1/chat/completions",
                             json=body(host.url("/gate/second")), timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("retry-after")
        assert "--server.max_client_media_bytes" in error_message(refused)
        assert not host.seen("/gate/second")  # refused before any fetch
        assert 'sgl_omni_admission_refusals_total{reason="media_budget"} 1.0' in httpx.get(
            f"{budget.url}/metrics", timeout=10).text
        # a request without client media still runs beside it
        plain = httpx.post(f"{budget.url}/v1/chat/completions", json=body(), timeout=60)
        assert plain.status_code == 200, plain.text
        host.open.set()
        thread.join(120)
    assert first and first[0].status_code == 200, first
    released(budget)  # success releases it
    again = httpx.post(f"{budget.url}/v1/chat/completions", json=body(host.url("/gate/second")),
                       timeout=60)
    assert again.status_code == 200, again.text
    released(budget)


def test_a_reservation_settles_to_what_the_media_took(budget: Server, host: GateHost) -> None:
    """Once read, a request's media count at their size (a 4x4 PNG), not at its worst case: a
    second request with remote media fits beside it."""
    released(budget)
    slow = [{"action": "final", "text": "{media}", "delay_s": 600}]
    payload = json.dumps(body(host.url("/gate/settle"), script=slow)).encode()
    with socket.create_connection(("127.0.0.1", budget.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        assert host.wait(lambda h: "/gate/settle" in h.paths)
        assert held(budget) == RESERVED
        host.open.set()
        wait_for(lambda: held(budget) == len(PNG), timeout=60)  # its turn runs on
        beside = httpx.post(f"{budget.url}/v1/chat/completions",
                            json=body(host.url("/gate/beside")), timeout=60)
        assert beside.status_code == 200, beside.text
    released(budget)  # the slow one's client left


def test_budget_released_when_a_fetch_fails(budget: Server, host: GateHost) -> None:
    resp = httpx.post(f"{budget.url}/v1/chat/completions",
                      json=body(host.url("/fail/one")), timeout=60)
    assert resp.status_code == 500, resp.text
    released(budget)


def test_budget_released_when_the_request_fails_after_its_media(budget: Server,
                                                                host: GateHost) -> None:
    host.open.set()
    failing = [{"error": {"status": 500, "message": "engine broke"}}]
    resp = httpx.post(f"{budget.url}/v1/chat/completions",
                      json=body(host.url("/gate/ok"), script=failing), timeout=60)
    assert resp.status_code == 500, resp.text
    released(budget)


@pytest.mark.parametrize("stream", [True, False])
def test_budget_released_when_the_client_leaves(budget: Server, host: GateHost,
                                                stream: bool) -> None:
    released(budget)
    payload = json.dumps(body(host.url("/gate/left"), stream=stream)).encode()
    with socket.create_connection(("127.0.0.1", budget.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        assert host.wait(lambda h: "/gate/left" in h.paths)
        assert held(budget) == RESERVED
    released(budget)  # the client left while its media were being fetched


def test_parts_are_fetched_concurrently_and_bounded(fetching: Server, host: GateHost) -> None:
    parts = [host.url(f"/gate/p{i}") for i in range(6)]
    with httpx.Client() as client:
        out, thread = in_background(client, fetching, body(*parts))
        # sequential fetches never have four at the gate at once
        assert host.wait(lambda h: h.waiting >= 4 or bool(out), timeout=60), (host.paths, out)
        assert not out, out[0].text  # still fetching: nothing answered yet
        host.open.set()
        thread.join(120)
    assert out and out[0].status_code == 200, out
    assert host.most_waiting == 4  # at most four at once
    assert sorted(host.paths) == sorted(f"/gate/p{i}" for i in range(6))


def test_a_request_over_its_media_deadline_fails_like_a_fetch_timeout(deadline: Server,
                                                                      host: GateHost) -> None:
    resp = httpx.post(f"{deadline.url}/v1/chat/completions",
                      json=body(host.url("/gate/slow1"), host.url("/gate/slow2")), timeout=120)
    assert resp.status_code == 500, resp.text
    message = error_message(resp)
    assert "--server.media_request_deadline_s" in message and "1 s" in message, message
    assert ".content[1].image_url" in message  # it names the part still being fetched
    released(deadline)


def test_text_only_chat_counts_its_media_against_the_budget(text_only: Server,
                                                            host: GateHost) -> None:
    """The Reasoner stage reads a text-only request's media itself and keeps them until the
    request ends: the request holds its worst case from admission to its end."""
    plain = [{"role": "user", "content": "hello"}]
    with httpx.Client() as client:
        first, thread = in_background(client, text_only, {
            "messages": body(host.url("/gate/t1"))["messages"]})
        assert host.wait(lambda h: "/gate/t1" in h.paths)
        assert held(text_only) == RESERVED
        refused = httpx.post(f"{text_only.url}/v1/chat/completions",
                             json=body(host.url("/gate/t2")), timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.headers.get("retry-after")
        assert not host.seen("/gate/t2")
        ok = httpx.post(f"{text_only.url}/v1/chat/completions", json={"messages": plain},
                        timeout=60)
        assert ok.status_code == 200, ok.text
        host.open.set()
        thread.join(120)
    assert first and first[0].status_code == 200, first
    released(text_only)


def pipelined_queue_after(server: Server, payload: dict) -> tuple[bytes, dict]:
    """Send ``payload`` to /v1/chat/completions and, on the same connection right behind it,
    ``GET /v1/queue``: the server reads the second request once the first is answered whole,
    so the queue it reports is the one the client sees as it has the answer. The first
    response's bytes, and the queue."""
    data = json.dumps(payload).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s"
                     b"GET /v1/queue HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                     % (len(data), data))
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    first, _, second = got.rpartition(b"HTTP/1.1 ")
    assert second.startswith(b"200"), got[-2000:]
    return first, json.loads(second.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("stream", [True, False])
def test_budget_released_as_the_answer_is_complete(budget: Server, host: GateHost,
                                                   stream: bool) -> None:
    """A request's client media stop counting once its answer is complete, not when its
    state is released later (a stream's closing, the stages told it ended): the queue read
    right behind the answer on its connection holds none of them."""
    released(budget)
    host.open.set()
    first, queue = pipelined_queue_after(budget, body(host.url("/gate/answered"),
                                                      stream=stream))
    assert first.startswith(b"HTTP/1.1 200"), first[:500]
    assert b"sha256" in first  # the answer names the image it read
    assert queue["client_media_bytes"] == 0, queue


def test_generation_media_of_stage_params_count_against_the_budget(budget: Server,
                                                                   host: GateHost) -> None:
    """``stage_params.generation.image_path`` is read by the generation stage for the
    request's generations: it counts from admission (at its worst case) to the request's end,
    even once the request's own media are read and settled (here: one 4x4 PNG, inline)."""
    released(budget)
    host.open.set()
    slow = [{"action": "final", "text": "{media}", "delay_s": 600}]
    own = "data:image/png;base64," + base64.b64encode(PNG).decode()
    payload = {**body(own, script=slow),
               "stage_params": {"generation": {"image_path": host.url("/gate/gen.png")}}}
    data = json.dumps(payload).encode()
    with socket.create_connection(("127.0.0.1", budget.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        # its media read (the reservation settled) and sent: the Reasoner stage holds them
        wait_for(lambda: stage_media(budget) == len(PNG), timeout=60)
        assert held(budget) == RESERVED + len(PNG)
        refused = httpx.post(f"{budget.url}/v1/chat/completions",
                             json=body(host.url("/gate/beside")), timeout=60)
        assert refused.status_code == 503, refused.text
        assert not host.seen("/gate/beside")
    released(budget)  # its client left
