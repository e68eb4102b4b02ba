"""``aio.threads.Threads``: the owner of a component's threads tells each to stop, joins them
within a bound, and names (and logs) any that did not stop; an ended thread is forgotten."""

from __future__ import annotations

import logging
import threading

import pytest

from sglang_omni.aio.threads import Threads, join_all


def test_join_stops_and_joins_every_thread() -> None:
    threads = Threads("a test component")
    stops = [threading.Event() for _ in range(3)]
    for i, stop in enumerate(stops):
        threads.start(stop.wait, name=f"waiter-{i}", stop=stop.set)
    assert threads.join(30) == [] and threads.alive() == []


def test_a_thread_that_does_not_stop_is_named_and_logged(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    threads = Threads("a test component")
    release = threading.Event()
    threads.start(release.wait, name="stubborn")  # no way to tell it to stop
    try:
        with caplog.at_level(logging.WARNING, logger="sglang_omni.aio"):
            assert threads.join(0.01) == ["stubborn"]
            assert "stubborn" in join_all(0.01)
        assert "a test component: thread stubborn did not stop" in caplog.text
    finally:
        release.set()
    assert threads.join(30) == []


def test_an_ended_thread_is_forgotten() -> None:
    threads = Threads("a test component")
    ended = threads.start(lambda: None, name="quick")
    ended.join(30)
    assert threads.alive() == [] and threads.join(0) == []
