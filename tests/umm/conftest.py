"""One interleaved server for every module of tests/umm that needs no special configuration
(modules that need one define their own ``server`` fixture). The tests do not interfere: each
uses its own request ids and compares job counters before and after."""

from __future__ import annotations

import pytest

from tests.umm.kit import umm_server


@pytest.fixture(scope="session")
def server():
    with umm_server("--generation.factory.step_time_s", "0.02", "--model-name", "cosmos3") as srv:
        yield srv
