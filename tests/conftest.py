"""Suite-wide hooks: the ``server`` marker on every test that starts a real server or stage
process (the rule is in ``tests/markers.py``), so ``pytest -m "not server"`` runs the unit tests
alone; how ``pytest -n N --dist loadfile`` (``make test``) spreads files over workers; and a
loud line at the end of a run whose browser tests were skipped (no chromium: the playground was
not tested, which a bare skip count hides)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests import server as server_module
from tests.markers import server_tests

#: Folders whose tests all go to one xdist worker: their session fixtures are too heavy to start
#: once per worker (tests/scale starts a local Ray cluster).
ONE_WORKER_FOLDERS = ("tests/scale/",)


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


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadfile``: whole files per worker (module-scoped servers start once), and
    each of :data:`ONE_WORKER_FOLDERS` whole on one worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((f for f in ONE_WORKER_FOLDERS if path.startswith(f)), path)

    return Scheduling(config, log)


#: Where the browser tests live (tests/playground/conftest.py skips them without chromium).
BROWSER_TESTS = "tests/playground/"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly, last, that the browser tests were skipped and why (with ``-q`` and under
    xdist too: the controller reads its workers' reports)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if getattr(r, "nodeid", "").startswith(BROWSER_TESTS)]
    if not skipped:
        return
    longrepr = skipped[0].longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    terminalreporter.write_sep(
        "!", f"{len(skipped)} BROWSER TESTS SKIPPED: the playground was not tested "
        f"({reason.removeprefix('Skipped: ')})", yellow=True, bold=True)
