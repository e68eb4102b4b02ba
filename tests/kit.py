"""Helpers shared by the test packages: stage job counters from ``/metrics`` and polling."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from tests.server import Server


def metric(server: Server, stage: str, outcome: str) -> float:
    """The ``sgl_omni_stage_jobs_total`` counter of ``stage``/``outcome``; AssertionError when
    ``/metrics`` has none."""
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    needle = f'sgl_omni_stage_jobs_total{{outcome="{outcome}",stage="{stage}"}} '
    for line in text.splitlines():
        if line.startswith(needle):
            return float(line[len(needle):])
    raise AssertionError(f"no metric {needle}")


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, poll: float = 0.05) -> float:
    """Seconds until ``condition()`` held; AssertionError after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(poll)
    return time.monotonic() - start


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> bool:
    """Whether ``condition()`` held within ``timeout`` seconds (checked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
