"""tests/scale: the unit tests need nothing; the fleet tests (those using ``cluster``) run a local
Ray cluster, are marked ``ray`` and ``server``, and are skipped where the ray extra is missing.

The cluster starts once per worker, inside the first fleet test that asks for it, and
pytest-timeout counts a test's fixtures' setup in its time: on a loaded machine the start (two
nodes, Serve) takes up to a minute, so a fleet test without a timeout of its own gets
:data:`CLUSTER_TEST_TIMEOUT_S`, not the suite's 120 s. (A test past its timeout ends its worker
process, and with it the worker's Ray cluster: Ray's reaper takes the worker's process group
down, so the GCS and raylets vanish without a line in their logs.)"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

HAS_RAY = importlib.util.find_spec("ray") is not None
#: The timeout of a fleet test that sets none: the cluster's start may fall in it.
CLUSTER_TEST_TIMEOUT_S = 300


def pytest_configure(config: pytest.Config) -> None:
    # Ray 2.60's own pydantic fields warn at import; nothing of ours.
    config.addinivalue_line("filterwarnings",
                            "ignore::DeprecationWarning:ray.serve._private.config")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.server)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(CLUSTER_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    if not HAS_RAY:
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")
    from tests.scale.kit import ray_cluster

    with ray_cluster() as c:
        yield c
