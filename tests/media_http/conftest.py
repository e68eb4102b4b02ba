"""The loopback media hosts the media-route tests fetch from (127.0.0.1 and 127.0.0.2)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.media.media_http_server import Handler, MediaServer, ServerState, bind_pair


@pytest.fixture(scope="module")
def hosts() -> Iterator[MediaServer]:
    state = ServerState()
    handler = type("Handler", (Handler,), {"state": state})
    servers = bind_pair(handler)
    for srv in servers:
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
    yield MediaServer(port=servers[0].server_address[1], state=state)
    state.stop.set()
    for srv in servers:
        srv.shutdown()
        srv.server_close()
