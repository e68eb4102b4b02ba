"""A finished request's answer is freed as its exchange ends, over HTTP, on new connections
(issue 33, 4: each closed connection kept its last request's scope, and with it the request's
run and generated videos, in a reference cycle until the cyclic collector ran; 100 worst-case
requests on new connections left the server +963 MiB).

The server runs with its cyclic garbage collector off (a ``sitecustomize`` on its path), so
anything kept by a reference cycle stays for good and shows in
``sgl_omni_finished_requests_in_memory`` (finished requests whose state or run is still in
memory, counted by weak references). The RSS figures are ``benchmarks/memory_creep.py``'s.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import httpx
import pytest

from tests.kit import no_request_states, script, wait_until
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import SMALL, final, image, video

GEN = {"stage_params": {"generation": SMALL}}
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
                       "hKmMIQAAAABJRU5ErkJggg==")
#: Turns the collector off in the server process and says so (a file naming its pid).
COLLECTOR_OFF = """\
import gc, os, sys
if "serve" in sys.argv:
    gc.disable()
    with open(os.path.join(os.path.dirname(__file__), f"gc-off-{os.getpid()}"), "w"):
        pass
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    path = tmp_path_factory.mktemp("collector-off")
    (path / "sitecustomize.py").write_text(COLLECTOR_OFF)
    python_path = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p)
    with Server(*SCRIPTED_UMM, env={"PYTHONPATH": python_path}) as running:
        assert (path / f"gc-off-{running.proc.pid}").exists(), "the collector is not off"
        yield running


def fresh() -> httpx.Client:
    """A client whose one connection is closed after its request (a new one per request)."""
    return httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def in_memory(server: Server) -> float:
    return Scrape(server).value("sgl_omni_finished_requests_in_memory")


def test_finished_requests_are_freed_on_new_connections(server: Server) -> None:
    """Interleaved requests with media (plain, streamed, failing after 200, refused) and a
    chat request with inline media, each on a connection of its own: afterwards no finished
    request is in memory, with the collector off."""
    media = script(image("a"), video("b"), final("done"))
    for _ in range(3):
        with fresh() as client:
            resp = client.post(f"{server.url}/generate", json={"prompt": media, **GEN})
            assert resp.status_code == 200, resp.text
        with fresh() as client, client.stream("POST", f"{server.url}/generate", json={
                "prompt": media, "stream": True, **GEN}) as stream:
            assert stream.status_code == 200 and "[DONE]" in stream.read().decode()
    with fresh() as client, client.stream("POST", f"{server.url}/generate", json={
            "prompt": script(image("!no-media")), "stream": True, **GEN}) as stream:
        assert "event: error" in stream.read().decode()
    with fresh() as client:
        assert client.post(f"{server.url}/generate", json={
            "prompt": "x", "temperature": "hot"}).status_code == 400
        chat = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(PNG).decode()}}]}]}
        assert client.post(f"{server.url}/v1/chat/completions", json=chat).status_code == 200
    assert no_request_states(server, timeout=30) is None
    assert wait_until(lambda: in_memory(server) == 0, timeout=30), \
        f"{in_memory(server):g} finished request(s) still in memory (kept by a reference cycle)"


def test_a_keep_alive_connection_does_not_keep_its_last_request(server: Server) -> None:
    """The connection stays open after its answer: its last request is freed all the same."""
    with fresh() as probe:
        probe.get(f"{server.url}/health")
    with httpx.Client(timeout=60) as client:
        resp = client.post(f"{server.url}/generate", json={
            "prompt": script(video("kept?"), final("done")), **GEN})
        assert resp.status_code == 200, resp.text
        assert no_request_states(server, timeout=30) is None
        assert wait_until(lambda: in_memory(server) == 0, timeout=30), \
            "the open connection keeps its finished request"
        assert client.get(f"{server.url}/health").status_code == 200  # still open, reused


def test_a_client_that_leaves_a_stream_mid_generation_is_freed(server: Server) -> None:
    """A client that leaves a streamed /generate while its generation runs: once the server
    has ended the request, nothing keeps it (its stream's close, the read-ahead's aclose and
    the run's abort make no reference cycle), with the collector off."""
    for _ in range(2):
        with fresh() as client, client.stream("POST", f"{server.url}/generate", json={
                "prompt": script(image("!sleep=3 left")), "stream": True,
                "include_progress": True, **GEN}) as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():  # until the generation runs; then it leaves
                if '"stage": "generation"' in line:
                    break
            else:
                pytest.fail("the stream ended before its generation ran")
    assert no_request_states(server, timeout=60) is None
    assert wait_until(lambda: in_memory(server) == 0, timeout=30), \
        f"{in_memory(server):g} finished request(s) still in memory after the client left"
