"""The gateway's memory of client request ids (no Ray needed)."""

from __future__ import annotations

import json

from sglang_omni.scale.rid_pins import INLINE_PARSE_BYTES, RidPins, client_rid, needs_thread


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_client_rid_reads_a_top_level_string_only() -> None:
    assert client_rid(b'{"prompt": "x", "rid": "a-1"}') == "a-1"
    assert client_rid(b'{"prompt": "x"}') is None
    assert client_rid(b'{"stage_params": {"rid": "inner"}}') is None
    for body in (b'{"rid": 5}', b'{"rid": ""}', b'["rid"]', b'{"rid": "x"', b'\xff"rid"',
                 json.dumps({"rid": "x" * 257}).encode(),
                 b'{"rid": "a", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        assert client_rid(body) is None, body[:40]
    assert client_rid(b'{"rid": "\\ud800"}') == "\ud800"  # the replica decides
    many = b'{"rid": "a-1", "x": [' + b",".join([b"{}"] * 100) + b"]}"
    assert client_rid(many) == "a-1"
    assert client_rid(many, max_values=100) is None  # refused by the replica; never parsed


def test_only_large_bodies_with_a_rid_are_parsed_off_the_loop() -> None:
    big = b'{"rid": "a", "prompt": "' + b"x" * INLINE_PARSE_BYTES + b'"}'
    assert needs_thread(big) and not needs_thread(b'{"rid": "a"}')
    assert not needs_thread(b'{"prompt": "' + b"x" * INLINE_PARSE_BYTES + b'"}')


def test_a_pin_lives_while_in_flight_and_for_the_window_after() -> None:
    clock = Clock()
    pins = RidPins(window_s=10, clock=clock)
    assert pins.replica_for("a") is None
    pins.started("a", "r1")
    clock.now = 100
    assert pins.replica_for("a") == "r1"  # in flight: no expiry
    pins.ended("a", "r1", refused=False)
    clock.now = 109
    assert pins.replica_for("a") == "r1"
    clock.now = 110
    assert pins.replica_for("a") is None and len(pins) == 0


def test_a_refused_request_lets_its_id_go_but_not_an_earlier_one() -> None:
    pins = RidPins(clock=Clock())
    pins.started("a", "r1")
    pins.ended("a", "r1", refused=True)
    assert pins.replica_for("a") is None
    pins.started("a", "r1")
    pins.started("a", "r1")  # the reuse, sent there and refused
    pins.ended("a", "r1", refused=True)
    assert pins.replica_for("a") == "r1"
    pins.ended("a", "r1", refused=False)
    assert pins.replica_for("a") == "r1"


def test_a_new_replica_takes_over_and_memory_is_bounded() -> None:
    pins = RidPins(capacity=2, clock=Clock())
    pins.started("a", "r1")
    pins.started("a", "r2")  # r1 died; the pin fell back to r2
    pins.ended("a", "r1", refused=False)  # the old replica's end changes nothing
    assert pins.replica_for("a") == "r2"
    pins.started("b", "r1")
    pins.started("c", "r1")
    assert len(pins) == 2 and pins.replica_for("a") is None
