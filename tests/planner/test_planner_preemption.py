"""The deadline plan when the generation stage pauses a younger request's generation for an older
one's (``PlannerConfig.preempt``): the older starts at once, the younger counts as paused, and
its expected finish moves by the older one's time.

Notation as in ``test_planner_rules``: timeout_s 100, R 1 s, G (image) 10 s.
"""

from __future__ import annotations

import pytest

from sglang_omni.pipeline.planner import (
    Admit,
    GenerationFinished,
    GenerationPlanner,
    GenerationQueued,
    GenerationStarted,
    PlannerConfig,
    Released,
    TurnEnded,
)
from tests.planner.kit import Clock, measure


def make(preempt: bool = True) -> tuple[GenerationPlanner, Clock]:
    clock = Clock()
    planner = GenerationPlanner(PlannerConfig(timeout_s=100, max_generations=1,
                                              preempt=preempt), clock)
    measure(planner, reasoner=1, image=10)
    return planner, clock


def plans(planner: GenerationPlanner) -> dict[str, tuple[str, float | None]]:
    return {p.request_id: (p.phase, p.finish) for p in planner.plan()}


def queue(planner: GenerationPlanner, rid: str) -> None:
    planner.handle(TurnEnded(rid, 1.0))
    planner.handle(GenerationQueued(rid, "image"))


def start_next(planner: GenerationPlanner) -> str | None:
    rid = planner.next_generation()
    if rid is not None:
        planner.handle(GenerationStarted(rid))
    return rid


def younger_running_older_queued(planner: GenerationPlanner, clock: Clock) -> None:
    """A (older) and B admitted at 0; B's generation starts at 1; A's is queued at 3."""
    for rid in ("A", "B"):
        assert planner.handle(Admit(rid)).refused is None
    clock.now = 1.0
    queue(planner, "B")
    assert start_next(planner) == "B"
    clock.now = 3.0
    queue(planner, "A")


def test_an_older_generation_starts_at_once_and_the_paused_one_finishes_later_by_its_time(
        ) -> None:
    planner, clock = make()
    younger_running_older_queued(planner, clock)
    # Before: B runs [1, 11] -> 12; A queued behind it [11, 21] -> 22.
    assert plans(planner) == {"A": ("queued", pytest.approx(22.0)),
                              "B": ("generating", pytest.approx(12.0))}
    assert start_next(planner) == "A"
    # After: A runs [3, 13] -> 14; B paused having run 2 s: its 8 s left [13, 21] -> 22.
    assert plans(planner) == {"A": ("generating", pytest.approx(14.0)),
                              "B": ("paused", pytest.approx(22.0))}
    clock.now = 13.0
    planner.handle(GenerationFinished("A", "image", 10.0))
    # A's generation ended: B resumes (as the stage's turns do), 8 s left: [13, 21] -> 22.
    assert plans(planner)["B"] == ("generating", pytest.approx(22.0))
    clock.now = 21.0
    planner.handle(GenerationFinished("B", "image", 10.0))  # its time less the 10 s paused
    assert plans(planner)["B"] == ("reasoning", pytest.approx(22.0))
    assert planner.times.longest_s["image"] == pytest.approx(10.0)


def test_without_preemption_the_older_waits_for_the_running_one() -> None:
    planner, clock = make(preempt=False)
    younger_running_older_queued(planner, clock)
    assert planner.next_generation() is None
    assert plans(planner)["A"] == ("queued", pytest.approx(22.0))


def test_a_younger_queued_generation_never_pauses_an_older_running_one() -> None:
    planner, clock = make()
    for rid in ("A", "B"):
        planner.handle(Admit(rid))
    clock.now = 1.0
    queue(planner, "A")
    assert start_next(planner) == "A"
    queue(planner, "B")
    assert planner.next_generation() is None


def test_nested_pauses_resume_the_oldest_paused_first() -> None:
    planner, clock = make()
    for rid in ("A", "B", "C"):
        planner.handle(Admit(rid))
    clock.now = 1.0
    queue(planner, "C")
    assert start_next(planner) == "C"
    clock.now = 2.0
    queue(planner, "B")
    assert start_next(planner) == "B"  # C paused, having run 1 s
    clock.now = 4.0
    queue(planner, "A")
    assert start_next(planner) == "A"  # B paused, having run 2 s
    # A [4, 14] -> 15; B's 8 s left [14, 22] -> 23; C's 9 s left [22, 31] -> 32.
    assert plans(planner) == {"A": ("generating", pytest.approx(15.0)),
                              "B": ("paused", pytest.approx(23.0)),
                              "C": ("paused", pytest.approx(32.0))}
    clock.now = 14.0
    planner.handle(GenerationFinished("A", "image", 10.0))
    assert plans(planner)["B"] == ("generating", pytest.approx(23.0))
    assert plans(planner)["C"] == ("paused", pytest.approx(32.0))


def test_a_released_paused_request_leaves_the_plan_and_the_running_one_keeps_the_stage(
        ) -> None:
    planner, clock = make()
    younger_running_older_queued(planner, clock)
    start_next(planner)
    planner.handle(Released("B"))  # the paused job was cancelled
    assert plans(planner) == {"A": ("generating", pytest.approx(14.0))}


def test_a_paused_generation_that_finished_first_is_accepted() -> None:
    # The stage could not pause B (its pause budget): B ends while the plan counts it paused.
    planner, clock = make()
    younger_running_older_queued(planner, clock)
    start_next(planner)
    clock.now = 11.0
    planner.handle(GenerationFinished("B", "image", 10.0))
    assert plans(planner)["B"][0] == "reasoning"
    assert plans(planner)["A"][0] == "generating"
