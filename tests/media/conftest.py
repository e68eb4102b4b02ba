"""Fixtures for the media policy tests (servers in ``media_http_server.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.media.media_http_server import (
    Handler,
    MediaServer,
    ServerState,
    bind_pair,
    gzip_bomb,
)


@pytest.fixture(scope="session")
def _media_servers() -> Iterator[MediaServer]:
    state = ServerState()
    gzip_bomb()  # made before any fetch: its compression takes longer than a fetch may wait
    handler = type("Handler", (Handler,), {"state": state})
    servers = bind_pair(handler)
    for server in servers:
        server.daemon_threads = True
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
    yield MediaServer(port=servers[0].server_address[1], state=state)
    state.stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def media_server(_media_servers: MediaServer) -> Iterator[MediaServer]:
    """The shared loopback media servers, with a fresh request log for this test."""
    _media_servers.state.reset()
    yield _media_servers
