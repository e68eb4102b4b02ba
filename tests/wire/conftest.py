"""One interleaved server with small wire limits, shared by the wire tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server import SCRIPTED_UMM, Server

LIMITS = ["--server.max_body_bytes", "1048576", "--server.max_json_depth", "64",
          "--server.max_json_values", "200000",
          "--server.header_timeout_s", "1", "--server.body_timeout_s", "1",
          "--server.idle_timeout_s", "1"]


@pytest.fixture(scope="session")
def limited() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *LIMITS) as server:
        yield server
