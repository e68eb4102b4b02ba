"""Suite-wide markers: ``server`` on every test that starts a real server or stage process (the
rule is in ``tests/markers.py``), so ``pytest -m "not server"`` runs the unit tests alone."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests import server as server_module
from tests.markers import server_tests


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in server_tests(items):
        item.add_marker(pytest.mark.server)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Generator[None, object, object]:
    """Tell ``tests.server`` which running test may not start a server (see its guard)."""
    server_module.unmarked_test = None if item.get_closest_marker("server") else item.nodeid
    try:
        return (yield)
    finally:
        server_module.unmarked_test = None
