"""tests/scale: the unit tests need nothing; the fleet tests (those using ``cluster``) run a local
Ray cluster, are marked ``ray`` and ``server``, and are skipped where the ray extra is missing."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

HAS_RAY = importlib.util.find_spec("ray") is not None


def pytest_configure(config: pytest.Config) -> None:
    # Ray 2.60's own pydantic fields warn at import; nothing of ours.
    config.addinivalue_line("filterwarnings",
                            "ignore::DeprecationWarning:ray.serve._private.config")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    if not HAS_RAY:
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")
    from tests.scale.kit import ray_cluster

    with ray_cluster() as c:
        yield c
