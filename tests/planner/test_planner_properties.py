"""Property tests: random traces through the planner and a one-generation-at-a-time stage.

With stable measured times (every turn and generation takes exactly its measured time, so the
longest and shortest never change) every admitted request's plan ends before its deadline after
every event, no plan is ever lowered, and every admitted request completes in time. With times
that vary, every request during whose life no longer time was measured still completes in time.
No plan ever exceeds ``max_generations`` (eight).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_omni.pipeline.planner import GenerationPlanner
from tests.planner.kit import Arrival, drive, make, measure

MAX_GEN = 8
TURNS = 2 * MAX_GEN + 1
SLACK = 1e-6


def halves(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Multiples of 0.5 s: exact in binary, so the asserts need no float slack to speak of."""
    return st.integers(int(lo * 2), int(hi * 2)).map(lambda n: n / 2)


@st.composite
def stable_world(draw):
    reasoner = draw(halves(0.5, 3))
    image = draw(halves(1, 30))
    video = draw(halves(image, 60))
    timeout = draw(halves(max(2 * reasoner + video, 30), 600))
    n = draw(st.integers(1, 25))
    arrivals = []
    for _ in range(n):
        mods = tuple(draw(st.lists(st.sampled_from(["image", "video"]),
                                   min_size=MAX_GEN, max_size=MAX_GEN)))
        arrivals.append(Arrival(
            gap=draw(halves(0, 120)), wants=draw(st.integers(0, MAX_GEN)), modalities=mods,
            turn_s=(reasoner,) * TURNS,
            gen_s=tuple(image if m == "image" else video for m in mods)))
    max_active = draw(st.none() | st.integers(1, 8))  # the orchestrator's cap (kit.drive)
    return reasoner, image, video, timeout, max_active, arrivals


def check_plans(planner: GenerationPlanner) -> None:
    for p in planner.plan():
        assert 0 <= p.allowance and p.used + p.allowance <= MAX_GEN, p
        if p.finish is not None and not p.kept_at_shortest:
            assert p.finish <= p.deadline + SLACK, p


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stable_world())
def test_with_stable_times_every_admitted_request_ends_in_time(world) -> None:
    reasoner, image, video, timeout, max_active, arrivals = world
    planner, clock = make(timeout_s=timeout, max_generations=MAX_GEN)
    measure(planner, reasoner=reasoner, image=image, video=video)
    run = drive(planner, clock, arrivals, check=check_plans, max_active=max_active)
    for update in run.updates:
        assert update.lowered == () and update.failed == () and update.receipt is None
    admitted = [o for o in run.outcomes.values() if o.admitted]
    assert admitted, "the first request always finds an idle server"
    for o in admitted:
        assert o.status == "completed" and o.ended_at <= o.deadline + SLACK
    # A request refused on arrival is never the only one: an idle server admits.
    assert planner.plan() == ()


@st.composite
def varying_world(draw):
    reasoner_hi = draw(halves(0.5, 3))
    image_hi = draw(halves(2, 30))
    video_hi = draw(halves(image_hi, 60))
    timeout = draw(halves(max(2 * reasoner_hi + video_hi, 30), 400))
    n = draw(st.integers(1, 20))
    arrivals = []
    for _ in range(n):
        mods = tuple(draw(st.lists(st.sampled_from(["image", "video"]),
                                   min_size=MAX_GEN, max_size=MAX_GEN)))
        gens = tuple(draw(halves(1, image_hi if m == "image" else video_hi)) for m in mods)
        turns = tuple(draw(st.lists(halves(0.5, reasoner_hi), min_size=TURNS, max_size=TURNS)))
        arrivals.append(Arrival(gap=draw(halves(0, 90)), wants=draw(st.integers(0, MAX_GEN)),
                                modalities=mods, turn_s=turns, gen_s=gens))
    warm = draw(st.booleans())
    return reasoner_hi, image_hi, video_hi, timeout, warm, arrivals


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(varying_world())
def test_while_measured_times_hold_no_admitted_request_times_out(world) -> None:
    reasoner_hi, image_hi, video_hi, timeout, warm, arrivals = world
    planner, clock = make(timeout_s=timeout, max_generations=MAX_GEN)
    if warm:  # else: startup, the first measurement settles the requests admitted before it
        measure(planner, reasoner=reasoner_hi, image=image_hi, video=video_hi)

    def check(p: GenerationPlanner) -> None:
        for plan in p.plan():
            assert 0 <= plan.allowance and plan.used + plan.allowance <= MAX_GEN, plan

    run = drive(planner, clock, arrivals, check=check, max_active=32)
    for rid, o in run.outcomes.items():
        if o.admitted and run.held(rid):
            assert o.status == "completed" and o.ended_at <= o.deadline + SLACK, (rid, o)
    assert planner.plan() == ()
