"""``GenerationPlanner.quote()``: what admission would give a new request now, read without
changing the plan (the routing stats of a replica behind Ray Serve). Numbers by hand: timeout_s
100, max_generations 2, R 1 s, G 10 s unless a test says otherwise."""

from __future__ import annotations

import pytest

from sglang_omni.pipeline.planner import (
    Admit,
    GenerationQueued,
    GenerationStarted,
    Quote,
    TurnEnded,
)
from tests.planner.kit import allowances, make, measure


def test_before_any_measurement_everything_is_admitted_and_nothing_bounds_the_stage() -> None:
    planner, _ = make()
    assert planner.quote() == Quote(allowance=2, idle=2, refused=False, stage_free_in_s=0.0,
                                    horizon_s=None, generation_s=None, active=0)


def test_idle_server_quote_and_its_horizon() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    quote = planner.quote()
    # Idle: 1 + 2 x (10 + 1) = 23 <= 100, so both generations; behind a stage free at f >= 1
    # the plan ends at f + 22, so the stage may be free until 100 - 22 = 78 s after admission.
    assert (quote.allowance, quote.idle, quote.refused) == (2, 2, False)
    assert quote.stage_free_in_s == 0.0
    assert quote.horizon_s == pytest.approx(78.0)
    assert quote.generation_s == 10.0 and quote.active == 0


def test_quote_follows_the_plan_and_changes_nothing() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    for rid in "ABC":
        assert planner.handle(Admit(rid)).refused is None
    before = planner.plan()
    quote = planner.quote()
    # The stage is free when the last planned generation ends: the last request's worst-case
    # finish less its final turn (R).
    assert quote.active == 3
    assert quote.stage_free_in_s == pytest.approx(max(p.finish for p in before) - 1.0)
    assert planner.plan() == before and set(allowances(planner)) == {"A", "B", "C"}
    # The quote agrees with admission: refused exactly when the next Admit is refused.
    assert quote.refused is (quote.stage_free_in_s > quote.horizon_s)
    assert (planner.handle(Admit("D")).refused is not None) is quote.refused


@pytest.mark.parametrize("admitted", range(0, 9))
def test_refused_exactly_when_the_stage_is_free_after_the_horizon(admitted: int) -> None:
    planner, clock = make(timeout_s=60, max_generations=2)
    measure(planner, reasoner=1, image=10)
    for i in range(admitted):
        planner.handle(Admit(f"r{i}"))
        clock.now += 0.5
    quote = planner.quote()
    assert quote.horizon_s is not None
    assert quote.refused is (quote.stage_free_in_s > quote.horizon_s + 1e-9)
    assert quote.refused is (planner.handle(Admit("probe")).refused is not None)


def test_a_running_generation_holds_the_stage() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    planner.handle(Admit("A"))
    clock.now = 1.0
    planner.handle(TurnEnded("A", 1.0))
    planner.handle(GenerationQueued("A", "image"))
    planner.handle(GenerationStarted("A"))
    clock.now = 4.0
    quote = planner.quote()
    # A's generation ends at 11 (7 s from now), then its last: after its turn, 12..22.
    assert quote.stage_free_in_s == pytest.approx(18.0)
    assert quote.active == 1 and not quote.refused


def test_no_generation_fits_an_idle_server() -> None:
    planner, _ = make(timeout_s=10)
    measure(planner, reasoner=1, image=20)
    quote = planner.quote()
    assert quote.idle == 0 and quote.refused and quote.horizon_s is None


def test_a_request_that_waited_has_an_earlier_deadline_and_the_horizon_less_its_wait() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    assert planner.handle(Admit("A", waited_s=30.0)).refused is None
    deadline = next(p.deadline for p in planner.plan() if p.request_id == "A")
    assert deadline == pytest.approx(clock.now + 70.0)  # timeout_s counts from its arrival
    # Behind A (stage free in ~22 s) the horizon is 78 s: a request that waited 50 s tolerates
    # only 28 s, and is refused, while one that waited 60 s is not admitted even alone.
    free_in = planner.quote().stage_free_in_s
    assert planner.quote().horizon_s - 50.0 > free_in
    assert planner.handle(Admit("B", waited_s=50.0)).refused is None
    refusal = planner.handle(Admit("C", waited_s=60.0)).refused
    assert refusal is not None and "after waiting 60.0 s in the fleet's queue" in refusal
    # An idle server: fine up to the horizon (78 s), not after it (it would plan fewer than 2).
    for wait, refused in ((77.0, False), (79.0, True), (0.0, False)):
        idle, _ = make()
        measure(idle, reasoner=1, image=10)
        assert (idle.handle(Admit("D", waited_s=wait)).refused is not None) is refused, wait


def test_a_request_refused_for_its_own_wait_is_told_so() -> None:
    """An idle server refusing a request whose wait in the fleet's queue left it fewer
    generations says that the wait did it, not a stage planned full behind no request."""
    idle, _ = make()
    measure(idle, reasoner=1, image=10)
    refusal = idle.handle(Admit("late", waited_s=79.0)).refused
    assert refusal is not None and "fully planned" not in refusal
    assert refusal.startswith("This request waited 79.0 s in the fleet's queue, which leaves it "
                              "time for only 1 of the 2 generations an idle server would have "
                              "given it on arrival"), refusal
    busy, _ = make()  # behind an active request that costs it a generation: the plan's message
    measure(busy, reasoner=1, image=10)
    assert busy.handle(Admit("A")).refused is None
    refusal = busy.handle(Admit("B", waited_s=70.0)).refused
    assert refusal is not None and refusal.startswith("The generation stage is fully planned")
    assert "after waiting 70.0 s in the fleet's queue" in refusal
