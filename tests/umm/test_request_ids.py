"""``RequestIds``: ids in flight and recently finished are taken, a refused request's id is free
again, and what is remembered is bounded in count, time and memory (issue 11, defect 8: every
id was remembered, up to 1,000,000 of them, ~440 MB)."""

from __future__ import annotations

import tracemalloc

import pytest

from sglang_omni.errors import BadRequest
from sglang_omni.runtime.request_ids import CAPACITY, WINDOW_S, RequestIds


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_id_in_flight_or_recently_finished_is_taken() -> None:
    clock = Clock()
    ids = RequestIds(clock=clock)
    assert ids.claim("a") == "a"
    with pytest.raises(BadRequest, match="in flight"):
        ids.claim("a")
    ids.finish("a")
    clock.now += WINDOW_S - 1
    with pytest.raises(BadRequest, match="ended less than 600 s ago"):
        ids.claim("a")
    clock.now += 2
    assert ids.claim("a") == "a"  # the window has passed


def test_a_refused_request_does_not_burn_its_id() -> None:
    ids = RequestIds()
    ids.claim("retry-me")
    ids.forget("retry-me")  # e.g. 503: the server is at max_active
    assert ids.claim("retry-me") == "retry-me"
    ids.finish("retry-me")
    ids.finish("retry-me")  # ending twice (two release paths) changes nothing
    ids.forget("retry-me")  # forgetting after the end does not free it either
    with pytest.raises(BadRequest):
        ids.claim("retry-me")


def test_server_ids_are_fresh_and_tracked_only_when_claimed() -> None:
    ids = RequestIds()
    generated = {ids.claim() for _ in range(100)}
    assert len(generated) == 100 and len(ids) == 100
    with pytest.raises(BadRequest):
        ids.claim(next(iter(generated)))  # a client cannot take over a request's id
    assert ids.new() != ids.new() and len(ids) == 100  # new(): not remembered at all


@pytest.mark.parametrize("bad", ["", "x" * 257, 7, ["a"]])
def test_a_malformed_client_id_is_refused(bad: object) -> None:
    with pytest.raises(BadRequest, match="rid: expected a non-empty string"):
        RequestIds().claim(bad)


def test_finished_ids_are_bounded_in_count_oldest_forgotten_first() -> None:
    ids = RequestIds(capacity=1000)
    for i in range(5000):
        ids.finish(ids.claim(f"r{i}"))
    assert len(ids) == 1000
    assert ids.claim("r0") == "r0"  # forgotten
    with pytest.raises(BadRequest):
        ids.claim("r4999")


def test_finished_ids_are_forgotten_after_the_window() -> None:
    clock = Clock()
    ids = RequestIds(window_s=60, clock=clock)
    for i in range(500):
        ids.finish(ids.claim(f"r{i}"))
        clock.now += 0.1
    clock.now += 60
    ids.claim("late")
    assert len(ids) == 1  # only the one in flight


def test_ids_in_flight_are_bounded_too() -> None:
    ids = RequestIds(capacity=100)
    for i in range(300):
        ids.claim(f"never-ended-{i}")  # a claim that is never ended (a bug) cannot grow memory
    assert len(ids) == 100


def test_memory_per_remembered_id_is_bounded() -> None:
    # At most 400 bytes per 32-character id: the default CAPACITY takes at most 40 MB.
    capacity = 5_000
    ids = RequestIds(capacity=capacity)
    tracemalloc.start()
    try:
        for _ in range(capacity + 1_000):
            ids.finish(ids.claim())
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ids) == capacity
    assert used < capacity * 400, used
    assert CAPACITY * 400 <= 40 * 1024 * 1024
