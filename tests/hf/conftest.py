"""The tiny checkpoint, built once per test session (tests here need the hf extra).

pytest-timeout counts a test's fixtures' setup in its time, and the first test of a module that
serves the tiny checkpoint pays for the checkpoint's build and an hf server's start (up to the
240 s its ``Server`` waits on a loaded machine): such a test without a timeout of its own gets
:data:`TINY_TEST_TIMEOUT_S`, not the suite's 120 s. (A test past its timeout ends its xdist
worker, which fails the run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

#: The timeout of a test using the tiny checkpoint that sets none: the build and a server's start
#: may fall in it.
TINY_TEST_TIMEOUT_S = 480


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tiny_checkpoint" in getattr(item, "fixturenames", ()) \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TINY_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("diffusers")
    from sglang_omni.models.cosmos3.tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "cosmos3")
