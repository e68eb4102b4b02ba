"""Servers shared by the reliability modules: the interleaved pipeline (roomy admission, so
no 503 is expected), text-only chat and direct generation (a small body limit, so 413 is
reachable), each with its own temp folder."""

from __future__ import annotations

import pytest

from tests.reliability.kit import BODY_LIMIT, ROOMY, TrackedServer, tracked_server
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, SCRIPTED_UMM


@pytest.fixture(scope="session")
def umm() -> TrackedServer:
    with tracked_server(*SCRIPTED_UMM, *ROOMY) as srv:
        yield srv


@pytest.fixture(scope="session")
def chat() -> TrackedServer:
    with tracked_server(*SCRIPTED_CHAT) as srv:
        yield srv


@pytest.fixture(scope="session")
def direct() -> TrackedServer:
    """Direct generation with a 1 MiB body limit (no media flags)."""
    with tracked_server(*SCRIPTED_GENERATION, "--server.max_body_bytes", str(BODY_LIMIT)) as srv:
        yield srv
