"""The deadline router's order (pure code): admitting replicas first, then the earliest stage,
then the fewest requests; what the router sent since the stats counts; already-tried replicas
last. Needs no Ray."""

from __future__ import annotations

import random

import pytest

from sglang_omni.scale.ranking import (
    UNKNOWN,
    Since,
    Standing,
    deadline_order,
    rotation,
    should_wait,
    standing,
)

NOW = 1000.0


def stats(free_in: float = 0.0, horizon: float | None = 20.0, *, in_flight: int = 0,
          idle: int = 2, generation_s: float | None = 5.0, refused: bool = False,
          health: str = "ok", at: float = NOW, max_active: int | None = 32) -> dict:
    return {"at": at, "health": health, "in_flight": in_flight, "max_active": max_active,
            "quote": {"allowance": idle, "idle": idle, "refused": refused,
                      "stage_free_in_s": free_in, "horizon_s": horizon,
                      "generation_s": generation_s, "active": in_flight}}


def test_an_admitting_replica_comes_before_an_earlier_refusing_one() -> None:
    table = {"busy": stats(free_in=25.0, in_flight=1), "late": stats(free_in=15.0, in_flight=9)}
    assert standing(table["busy"], Since(), NOW).refuses
    assert not standing(table["late"], Since(), NOW).refuses
    assert deadline_order(["busy", "late"], table, {}, NOW) == ["late", "busy"]


def test_the_earliest_stage_wins_then_the_fewest_requests() -> None:
    table = {"a": stats(free_in=8.0, in_flight=1), "b": stats(free_in=3.0, in_flight=4),
             "c": stats(free_in=3.0, in_flight=2)}
    assert deadline_order(["a", "b", "c"], table, {}, NOW) == ["c", "b", "a"]


def test_sends_since_the_stats_count_a_full_plan_each() -> None:
    # Two unseen requests on "a": 2 x idle 2 x 5 s = 20 s more stage time.
    table = {"a": stats(free_in=0.0), "b": stats(free_in=12.0)}
    assert deadline_order(["a", "b"], table, {"a": Since(unseen=2)}, NOW) == ["b", "a"]
    assert standing(table["a"], Since(unseen=2), NOW) == Standing(False, 20.0, 2)
    # A third would take it past the 20 s horizon: refused there.
    assert standing(table["a"], Since(unseen=3), NOW).refuses


def test_requests_on_their_way_to_admission_count_a_full_plan_each() -> None:
    # "a" holds three planned requests but its planner only one: two more plans (2 x 2 x 5 s)
    # are on their way, so "b", with 12 s planned, starts a new request's generation sooner.
    a = {**stats(free_in=0.0, in_flight=3), "planned_in_flight": 3}
    a["quote"]["active"] = 1
    table = {"a": a, "b": stats(free_in=12.0, in_flight=1)}
    assert standing(a, Since(), NOW) == Standing(False, 20.0, 3)
    assert deadline_order(["a", "b"], table, {}, NOW) == ["b", "a"]


def test_requests_ended_since_the_stats_give_their_share_back() -> None:
    busy = stats(free_in=30.0, in_flight=2)  # two requests planned: refuses (horizon 20)
    assert standing(busy, Since(), NOW).refuses
    assert standing(busy, Since(ended=1), NOW) == Standing(False, 15.0, 1)
    assert standing(busy, Since(ended=2), NOW) == Standing(False, 0.0, 0)
    assert standing(busy, Since(ended=5), NOW) == Standing(False, 0.0, 0)


def test_stats_age_runs_the_stage_clock_down() -> None:
    old = stats(free_in=25.0, at=NOW - 10.0)  # 25 s when recorded 10 s ago: 15 s now
    assert standing(old, Since(), NOW) == Standing(False, pytest.approx(15.0), 0)
    assert standing(stats(free_in=4.0, at=NOW - 10.0), Since(), NOW).free_in_s == 0.0


def test_before_any_measurement_every_healthy_replica_admits_and_load_decides() -> None:
    table = {"a": stats(horizon=None, generation_s=None, in_flight=2),
             "b": stats(horizon=None, generation_s=None, in_flight=1)}
    assert deadline_order(["a", "b"], table, {"b": Since(unseen=3)}, NOW) == ["a", "b"]
    refusing = stats(horizon=None, refused=True, idle=0)
    assert standing(refusing, Since(), NOW).refuses


def test_max_active_refuses() -> None:
    assert standing(stats(in_flight=1, max_active=1), Since(), NOW).refuses
    assert standing(stats(in_flight=0, max_active=1), Since(unseen=1), NOW).refuses
    assert not standing(stats(in_flight=0, max_active=1), Since(), NOW).refuses
    assert not standing(stats(in_flight=1, max_active=1), Since(ended=1), NOW).refuses


def test_unhealthy_or_silent_replicas_go_last() -> None:
    table = {"sick": stats(health="restarting"), "none": None, "ok": stats(free_in=19.0)}
    assert standing(table["sick"], Since(), NOW) == UNKNOWN
    assert deadline_order(["sick", "none", "ok"], table, {}, NOW)[0] == "ok"


def test_without_a_planner_the_load_decides() -> None:
    plain = {"a": {**stats(in_flight=3), "quote": None}, "b": {**stats(in_flight=1),
                                                               "quote": None}}
    assert deadline_order(["a", "b"], plain, {}, NOW) == ["b", "a"]


def test_tried_replicas_are_left_out_unless_all_were() -> None:
    table = {"a": stats(), "b": stats(free_in=10.0)}
    assert deadline_order(["a", "b"], table, {}, NOW, frozenset({"a"})) == ["b"]
    assert sorted(deadline_order(["a", "b"], table, {}, NOW, frozenset({"a", "b"}))) == ["a", "b"]


def test_ties_are_broken_at_random() -> None:
    table = {k: stats() for k in "abcd"}
    firsts = {deadline_order(list("abcd"), table, {}, NOW, rng=random.Random(seed))[0]
              for seed in range(40)}
    assert firsts == set("abcd")


def test_rotation() -> None:
    assert rotation(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotation(["a", "b", "c"], 0, frozenset({"a"})) == ["b", "c"]
    sick = {"a": {"health": "stalled"}, "b": {"health": "ok"}, "c": None}
    assert rotation(["a", "b", "c"], 0, stats=sick) == ["b", "c", "a"]


def test_a_wait_uses_up_the_horizon() -> None:
    table = {"a": stats(free_in=12.0)}
    assert not standing(table["a"], Since(), NOW, waited_s=7.0).refuses  # 12 <= 20 - 7
    assert standing(table["a"], Since(), NOW, waited_s=9.0).refuses  # 12 > 20 - 9


def test_a_request_waits_only_while_none_admits_and_one_could_later() -> None:
    busy = {"a": stats(free_in=25.0), "b": stats(free_in=30.0)}
    assert should_wait(["a", "b"], busy, {}, NOW, waited_s=1.0)
    # One admits now: send it.
    mixed = {"a": stats(free_in=25.0), "b": stats(free_in=5.0)}
    assert not should_wait(["a", "b"], mixed, {}, NOW, waited_s=1.0)
    # The wait used up every horizon: no replica could admit it any more; send it (to a 503).
    assert not should_wait(["a", "b"], busy, {}, NOW, waited_s=20.0)
    # Nothing to wait for: no planner measured yet, or no healthy replica.
    assert not should_wait(["a"], {"a": stats(free_in=25.0, horizon=None, refused=True)}, {},
                           NOW, waited_s=0.0)
    assert not should_wait(["a"], {"a": stats(free_in=25.0, health="stalled")}, {}, NOW, 0.0)
    # Full by max_active: it frees up when a request ends.
    full = {"a": stats(in_flight=2, max_active=2)}
    assert should_wait(["a"], full, {}, NOW, waited_s=0.0)
