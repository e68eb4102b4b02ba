"""Each rule of the generation planner, with hand-computed numbers.

Notation in the comments: R is the longest Reasoner turn, G the longest generation of any
modality, [s,e] a generation on the stage, "-> f" a request's worst-case finish (its last
generation's end + R). Unless a test says otherwise: timeout_s 100, max_generations 2, R 1 s.
"""

from __future__ import annotations

import pytest

from sglang_omni.pipeline.planner import (
    RECEIPT_TEXT,
    Admit,
    FailFast,
    GenerationFinished,
    GenerationQueued,
    GenerationStarted,
    PlanChange,
    PlannerConfig,
    Released,
    Tick,
    TurnEnded,
    TurnStarted,
)
from tests.planner.kit import GHOST, allowances, make, measure


def admit(planner, rid) -> int:
    """Admit ``rid``, which must be admitted; the generations its first turn is offered."""
    update = planner.handle(Admit(rid))
    assert update.refused is None, update.refused
    return planner.allowance(rid)


def refuse(planner, rid) -> str:
    """Offer ``rid``, which must be refused; the refusal (a 503's message)."""
    update = planner.handle(Admit(rid))
    assert update.refused is not None and update.failed == () and update.lowered == ()
    assert rid not in allowances(planner)
    return update.refused


def queue(planner, rid, modality, turn_s=1.0):
    planner.handle(TurnEnded(rid, turn_s))
    return planner.handle(GenerationQueued(rid, modality))


# --- admission ------------------------------------------------------------------------------------
def test_idle_server_allowance_with_the_default_eight_generations() -> None:
    planner, _ = make(timeout_s=600, max_generations=8)
    measure(planner, reasoner=2, image=20, video=60)  # G = 60
    # Idle: 2 + 8 x (60 + 2) = 498 <= 600, so all eight.
    assert admit(planner, "A") == 8
    assert planner.plan()[0].deadline == 600
    assert planner.plan()[0].finish == pytest.approx(498)
    # A's generations end at 2+60=62, 124, ..., 2 + 8*60 + 7*2 = 496. Behind them B's first
    # ends at 556 (-> 558 <= 600), a second at 558+60 = 618 > 600: 1 < 8, refused.
    message = refuse(planner, "B")
    assert "only 1 of the 8 generations" in message and "retry later" in message


def test_new_requests_plan_behind_the_active_ones_and_are_refused_below_an_idle_server() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)  # G = 10
    # Idle: 1 + 2 x (10 + 1) = 23 <= 100 -> 2.
    # A: [1,11] [12,22] -> 23; B: [22,32] [33,43] -> 44; C: [43,53] [54,64] -> 65;
    # D: [64,74] [75,85] -> 86.
    for rid in "ABCD":
        assert admit(planner, rid) == 2, rid
    assert [p.finish for p in planner.plan()] == [23, 44, 65, 86]
    # E: [85,95] -> 96 fits one, [96,106] not: 1 < 2 -> refused, nothing else changes.
    assert "4 active requests" in refuse(planner, "E")
    assert allowances(planner) == dict.fromkeys("ABCD", 2)


def test_admission_offers_the_first_turn() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    assert planner.handle(Admit("A")).refused is None
    assert planner.allowance("A") == 2
    assert planner.plan()[0].finish == 23  # the turn running now was offered both generations


def test_a_release_frees_the_stage_for_new_requests() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    for rid in "ABCD":  # as above: E does not fit behind them
        admit(planner, rid)
    assert "retry later" in refuse(planner, "E")
    planner.handle(Released("A"))
    # B -> 23, C -> 44, D -> 65; E: [64,74] [75,85] -> 86.
    assert admit(planner, "E") == 2


def test_a_generation_longer_than_timeout_refuses_everyone() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, video=150)  # 1 + 150 + 1 > 100: an idle server gives 0
    assert "longer than timeout_s" in refuse(planner, "A")


# --- longer times: re-plan in the stage's order ---------------------------------------------------
def test_a_longer_time_replans_in_stage_order() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    for rid in "ABCD":
        admit(planner, rid)
    update = measure(planner, video=30)  # G = 30, at t = 0
    # A: [1,31] [32,62] -> 63 keeps 2. B: [62,92] -> 93 fits 1, [93,123] not -> 1.
    # C: [92,122] -> 123 > 100 -> 0, offered only a final answer; likewise D.
    assert update is not None and update.measured_longer
    assert update.lowered == (PlanChange("B", 2, 1), PlanChange("C", 2, 0), PlanChange("D", 2, 0))
    assert update.failed == ()
    assert allowances(planner) == {"A": 2, "B": 1, "C": 0, "D": 0}
    assert [p.finish for p in planner.plan()] == [63, 93, 2, 2]  # C, D: turn 1 + receipt turn 1


def test_a_generation_chosen_without_a_plan_returns_as_a_receipt() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    for rid in "ABC":
        admit(planner, rid)
    measure(planner, video=30)  # as above: C is left with 0
    clock.now = 1
    update = queue(planner, "C", "image")
    assert update.receipt == RECEIPT_TEXT
    assert planner.allowance("C") == 0  # its next turn is offered only a final answer
    (c,) = [p for p in planner.plan() if p.request_id == "C"]
    assert (c.phase, c.used, c.finish) == ("reasoning", 0, 2)  # 1 + R, no receipt turn after it
    again = queue(planner, "C", "image", turn_s=0.5)  # ignores the offer: a receipt again
    assert again.receipt == RECEIPT_TEXT


def test_a_turn_that_starts_without_allowance_is_offered_only_a_final_answer() -> None:
    planner, clock = make(max_generations=1)
    measure(planner, reasoner=1, image=10)
    admit(planner, "A")
    clock.now = 1
    queue(planner, "A", "image")
    assert planner.next_generation() == "A"
    planner.handle(GenerationStarted("A"))
    clock.now = 11
    planner.handle(GenerationFinished("A", "image", 10))
    assert planner.allowance("A") == 0
    assert planner.plan()[0].finish == 12  # this turn (11 + 1) is the last one


# --- fail fast, keep at the shortest time ---------------------------------------------------------
def _three_queued_images():
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    for rid in "ABC":  # A -> 23, B -> 44, C -> 65 (see above)
        admit(planner, rid)
    clock.now = 1
    for rid in "ABC":
        queue(planner, rid, "image")  # each has 1 left
    assert planner.next_generation() == "A"
    planner.handle(GenerationStarted("A"))
    # A runs [1,11] -> 12, [12,22] -> 23; B [22,32] -> 33, [33,43] -> 44; C [43,53] ... -> 65.
    assert [p.finish for p in planner.plan()] == [23, 44, 65]
    return planner, clock


def test_fail_fast_when_even_the_shortest_time_is_late_and_keep_when_it_fits() -> None:
    planner, _ = _three_queued_images()
    # At t = 1 an image of 40 s is measured: image longest 40, shortest 10, G = 40.
    update = measure(planner, image=40)
    assert update is not None and update.measured_longer
    # A runs [1,41] -> 42, [42,82] -> 83 <= 100: keeps 1. Stage free at 82.
    # B's queued image [82,122] -> 123 > 100 even with 0 more; at its shortest 10 s:
    #   [82,92] -> 93 <= 100, so it keeps its place with 0 more (1 -> 0).
    # C's queued image starts behind B's, counted at 40: 122; at 10 s: [122,132] -> 133 > 100:
    #   it fails at once and its queued generation is cancelled.
    assert update.lowered == (PlanChange("B", 1, 0),)
    (fail,) = update.failed
    assert isinstance(fail, FailFast)
    assert fail.request_id == "C" and "its queued image generation" in fail.message
    assert "133.0 s after admission" in fail.message and "shortest image time" in fail.message
    assert "retry later" in fail.message and "cancelled" in fail.message
    plans = {p.request_id: p for p in planner.plan()}
    assert set(plans) == {"A", "B"}
    assert plans["B"].kept_at_shortest and plans["B"].finish == 123
    planner.handle(Released("C"))  # the orchestrator's release after the 503 is a no-op


def test_a_kept_generation_keeps_its_place_and_can_fit_again() -> None:
    planner, clock = _three_queued_images()
    measure(planner, image=40)
    clock.now = 11
    planner.handle(GenerationFinished("A", "image", 10))
    # Stage free at 11. A: turn to 12, [12,52] -> 53. B: [52,92] -> 93 <= 100 at the longest
    # time again (no longer kept); one more, [93,133], does not fit.
    assert planner.allowance("A") == 1
    plans = {p.request_id: p for p in planner.plan()}
    assert not plans["B"].kept_at_shortest and plans["B"].finish == 93
    # Starting B now: [11,51]; A then [51,91] -> 92 <= 100, so the stage takes B.
    assert planner.next_generation() == "B"


def test_a_running_generation_that_cannot_finish_fails_fast() -> None:
    planner, clock = make(max_generations=1)
    measure(planner, reasoner=1, image=10)
    admit(planner, "A")
    clock.now = 1
    queue(planner, "A", "image")
    planner.handle(GenerationStarted("A"))
    clock.now = 98.5  # running 97.5 s of a 10 s image: ends no earlier than now, + R = 99.5
    assert planner.handle(Tick()).failed == ()
    clock.now = 99.5  # now + R = 100.5 > 100 even at the shortest time
    (fail,) = planner.handle(Tick()).failed
    assert fail.request_id == "A" and "its running image generation" in fail.message
    assert planner.plan() == ()


# --- giving generations back ----------------------------------------------------------------------
@pytest.mark.parametrize(("c_admitted_at", "b_gets_one_back"), [(10, True), (1, False)])
def test_a_lowered_request_gets_a_generation_back_when_later_ones_keep_theirs(
        c_admitted_at: float, b_gets_one_back: bool) -> None:
    planner, clock = make()
    # Startup: nothing measured, every request is admitted with 2.
    admit(planner, "A")
    admit(planner, "B")
    clock.now = c_admitted_at
    admit(planner, "C")  # deadline c + 100
    clock.now = 40  # A's and B's first turns (started at 0) have not returned: they end now
    measure(planner, reasoner=1)
    update = measure(planner, video=30)  # the first generation measured: the plan settles all
    # A: [40,70] -> 71, [71,101] late -> 1.  B: [70,100] -> 101 > 100 -> 0 (40 + 1 + 1 = 42).
    # C (turn ends at max(c + 1, 40) = 40): [70,100] -> 101 <= c + 100; [101,131] -> 132 late.
    assert update is not None and update.measured_longer
    assert update.lowered == (PlanChange("A", 2, 1), PlanChange("B", 2, 0), PlanChange("C", 2, 1))
    clock.now = 41
    update = planner.handle(Released("A"))
    # Stage free at 41. B with 1: [41,71] -> 72 <= 100. C behind it: [71,101] -> 102, which is
    # within C's deadline when C came at 10 (110) but not at 1 (101). B comes first: with C at
    # 10 the freed time goes to B, although C alone could have used it ([41,71] [72,102] -> 103).
    assert update.lowered == () and update.failed == ()
    if b_gets_one_back:
        assert allowances(planner) == {"B": 1, "C": 1}
    else:
        assert allowances(planner) == {"B": 0, "C": 1}
    assert all(p.finish <= p.deadline for p in planner.plan())


def test_expired_measurements_raise_plans() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, video=60)
    clock.now = 50
    measure(planner, video=20)
    clock.now = 99.5
    # Video longest is still 60 (taken at 0): 99.5 + 1 + 60 + 1 = 161.5 fits 199.5, a second
    # (+ 61 = 222.5) does not -> 1, which is also what an idle server gives.
    assert admit(planner, "A") == 1
    clock.now = 100  # the 60 s video and the 1 s turn, taken at 0, are still in the window
    assert planner.handle(Tick()).lowered == () and planner.allowance("A") == 1
    clock.now = 100.25  # now they have left it
    update = planner.handle(Tick())
    # G = 20 now (the 1 s turn stands in as the latest turn). A's turn ends at 100.5:
    # [100.5,120.5] -> 121.5, [121.5,141.5] -> 142.5 <= 199.5 -> 2.
    assert planner.allowance("A") == 2 and not update.measured_longer
    assert planner.times.longest_s["video"] == 20


# --- the generation stage: oldest first, without breaking older plans ----------------------------
def test_the_stage_serves_the_oldest_request_first_and_keeps_older_plans() -> None:
    planner, clock = make(timeout_s=120)
    admit(planner, "A")
    clock.now = 1
    queue(planner, "A", "video")  # reports R = 1
    assert planner.next_generation() == "A"  # startup: nothing to check yet
    planner.handle(GenerationStarted("A"))
    clock.now = 5
    assert admit(planner, "B") == 2  # startup: A's video has run 4 s < 120 s
    clock.now = 6
    queue(planner, "B", "video")
    assert planner.next_generation() is None  # the stage is busy
    clock.now = 41
    update = planner.handle(GenerationFinished("A", "video", 40))
    # First measurement: video 40, R 1. A (turn to 42): [42,82] -> 83 <= 120: keeps 1.
    # B's queued video [82,122] -> 123 <= 125; one more [123,163] does not fit: 1 -> 0.
    assert planner.allowance("A") == 1 and update.lowered == (PlanChange("B", 1, 0),)
    # Starting B's video now would hold the stage until 81: A's then [81,121] -> 122 > 120.
    # B waits for A's turn instead of pushing A past its deadline.
    assert planner.next_generation() is None
    clock.now = 42
    queue(planner, "A", "video")
    assert planner.next_generation() == "A"  # queued later than B's, but A is older
    planner.handle(GenerationStarted("A"))
    clock.now = 82
    planner.handle(GenerationFinished("A", "video", 40))
    assert planner.allowance("A") == 0
    # A's last turn needs no generation: B [82,122] -> 123 <= 125.
    assert planner.next_generation() == "B"


# --- startup --------------------------------------------------------------------------------------
def test_startup_admits_and_the_first_measurement_settles() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)  # a turn measured; no generation yet
    for rid in "ABCDE":
        assert admit(planner, rid) == 2
    assert all(p.finish is None for p in planner.plan())
    update = measure(planner, image=10)
    # A -> 23, B -> 44, C -> 65, D -> 86 keep 2; E: [85,95] -> 96, [96,106] late -> 1.
    assert update is not None and update.measured_longer
    assert update.lowered == (PlanChange("E", 2, 1),)
    assert [p.finish for p in planner.plan()] == [23, 44, 65, 86, 96]


def test_startup_refuses_once_the_first_generation_outlasts_timeout() -> None:
    planner, clock = make()
    admit(planner, "A")
    clock.now = 1
    queue(planner, "A", "image")
    planner.handle(GenerationStarted("A"))
    clock.now = 101  # running 100 s: not yet longer than timeout_s
    assert admit(planner, "B") == 2
    clock.now = 101.5
    message = refuse(planner, "C")
    assert "first generation" in message and "retry later" in message


# --- measurement window ---------------------------------------------------------------------------
def test_times_are_the_extremes_of_the_last_timeout_s() -> None:
    planner, clock = make()
    measure(planner, reasoner=2, video=30)
    clock.now = 50
    measure(planner, reasoner=1, video=20)
    clock.now = 99
    planner.handle(Tick())
    t = planner.times
    assert (t.reasoner_s, t.longest_s["video"], t.shortest_s["video"]) == (2, 30, 20)
    assert t.generation_s == 30 and t.longest("image") == 30 and t.shortest("image") == 0
    clock.now = 101  # the samples of t = 0 are older than 100 s
    planner.handle(Tick())
    t = planner.times
    assert (t.reasoner_s, t.longest_s["video"], t.shortest_s["video"]) == (1, 20, 20)
    clock.now = 1000  # all expired: the latest samples stand in
    planner.handle(Tick())
    t = planner.times
    assert (t.reasoner_s, t.longest_s["video"]) == (1, 20)


def test_an_unmeasured_modality_counts_at_the_longest_generation() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    admit(planner, "A")
    clock.now = 1
    queue(planner, "A", "video")  # no video measured yet: it counts at G = 10
    # [1,11] -> 12, one more [12,22] -> 23.
    assert planner.plan()[0].finish == 23 and planner.times.longest("video") == 10
    update = measure(planner, video=30)  # G = 30: [1,31] -> 32, [32,62] -> 63
    assert update is not None and update.measured_longer and update.lowered == ()
    assert planner.plan()[0].finish == 63


def test_the_first_measurement_of_each_series_counts_as_longer() -> None:
    planner, _ = make()
    assert measure(planner, reasoner=1).measured_longer
    assert measure(planner, image=10).measured_longer
    assert measure(planner, video=5).measured_longer  # first video, although shorter than G
    assert not measure(planner, video=5).measured_longer
    assert not measure(planner, image=9).measured_longer


# --- the event contract ---------------------------------------------------------------------------
def test_events_that_contradict_the_state_raise() -> None:
    planner, clock = make()
    measure(planner, reasoner=1, image=10)
    admit(planner, "A")
    admit(planner, "B")
    with pytest.raises(ValueError):
        admit(planner, "A")
    with pytest.raises(ValueError):
        planner.handle(GenerationStarted("A"))  # nothing queued
    with pytest.raises(KeyError):
        planner.handle(GenerationQueued("Z", "image"))
    clock.now = 1
    queue(planner, "A", "image")
    queue(planner, "B", "image")
    planner.handle(GenerationStarted("A"))
    with pytest.raises(ValueError):
        planner.handle(GenerationStarted("B"))  # the stage runs one generation at a time
    with pytest.raises(ValueError):
        planner.handle(GenerationQueued("A", "image"))  # already has one pending
    with pytest.raises(TypeError):
        planner.handle("tick")  # type: ignore[arg-type]


def test_unknown_requests_still_measure_and_release_is_idempotent() -> None:
    planner, _ = make()
    planner.handle(Released("nobody"))
    planner.handle(GenerationFinished(GHOST, "audio", 7))
    assert planner.times.longest_s == {"audio": 7}


def test_config_is_validated() -> None:
    for bad in ({"timeout_s": 0}, {"max_generations": -1}):
        with pytest.raises(ValueError):
            PlannerConfig(**bad)


# --- receipt turns --------------------------------------------------------------------------------
def test_turn_started_after_a_receipt_turn_keeps_the_plan() -> None:
    planner, _ = make()
    measure(planner, reasoner=1, image=10)
    admit(planner, "A")
    # A's decision was answered by a receipt (a blank prompt): its next turn starts at once,
    # with the same allowance; a turn may not start while a generation is queued.
    planner.handle(TurnEnded("A", 1.0))
    planner.handle(TurnStarted("A"))
    assert planner.allowance("A") == 2
    assert planner.plan()[0].finish == 23  # the new turn is offered both generations
    planner.handle(TurnEnded("A", 1.0))
    planner.handle(GenerationQueued("A", "image"))
    with pytest.raises(ValueError):
        planner.handle(TurnStarted("A"))


# --- denoising steps ------------------------------------------------------------------------------
def measure_steps(planner, modality: str, seconds: float, steps: int | None) -> None:
    planner.handle(GenerationFinished(GHOST, modality, seconds, steps))


def test_more_steps_than_measured_are_planned_at_the_time_per_step() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 10, steps=10)  # 1 s a step
    # 30 steps: 30 s a generation. Idle: 1 + 30 + 1 + 30 + 1 = 63 <= 100: both generations.
    assert planner.handle(Admit("A", steps=30)).refused is None
    assert planner.allowance("A") == 2
    assert planner.plan()[0].finish == pytest.approx(63)
    # Behind A (stage free at 61) B's first 30-step generation ends 61 + 30 = 91 (-> 92), a
    # second at 122: 1 of 2, refused. At the engine's default (10 s a generation) B would fit.
    update = planner.handle(Admit("B", steps=30))
    assert update.refused is not None and "only 1 of the 2 generations" in update.refused
    assert planner.handle(Admit("C")).refused is None


def test_fewer_steps_than_measured_keep_the_longest_time() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 10, steps=10)
    planner.handle(Admit("A", steps=2))  # 2 x 1 s would drop the fixed cost: planned at 10 s
    assert planner.plan()[0].finish == pytest.approx(1 + 10 + 1 + 10 + 1)


def test_a_request_whose_steps_alone_do_not_fit_is_told_to_ask_for_fewer() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)
    measure_steps(planner, "video", 20, steps=10)  # 2 s a step
    # 60 steps: 120 s, longer than timeout_s 100 on an idle server.
    message = refuse_with(planner, Admit("A", steps=60))
    assert "60 denoising steps" in message and "fewer num_inference_steps" in message
    assert "about 49 fit" in message  # (100 - 2 x 1) / 2
    assert planner.handle(Admit("B", steps=40)).refused is None  # 80 s + 2 turns fits


def test_a_longer_time_per_step_is_a_longer_time() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 10, steps=10)
    assert planner.handle(Admit("A", steps=40)).refused is None  # 40 s a generation: 1 of 2
    assert planner.allowance("A") == 2
    # the same 10 s generation measured at 5 steps: 2 s a step, so 80 s for A's generations
    update = planner.handle(GenerationFinished(GHOST, "image", 10, 5))
    assert update.measured_longer
    assert update.lowered == (PlanChange("A", 2, 1),)


def test_generations_of_unknown_steps_measure_no_time_per_step() -> None:
    planner, _ = make()
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 10, steps=None)
    assert planner.times.step_s == {}
    planner.handle(Admit("A", steps=100))  # nothing to scale by: the longest time stands
    assert planner.plan()[0].finish == pytest.approx(23)


def refuse_with(planner, admit: Admit) -> str:
    update = planner.handle(admit)
    assert update.refused is not None
    assert admit.request_id not in allowances(planner)
    return update.refused


def test_the_time_per_step_expires_with_the_window() -> None:
    planner, clock = make()  # timeout_s 100: the window
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 40, steps=4)  # 10 s a step, once
    clock.now = 150
    measure_steps(planner, "image", 8, steps=4)
    planner.handle(Tick())
    assert planner.times.step_s == {"image": 2.0}  # the slow sample left the window
    assert planner.handle(Admit("A", steps=8)).refused is None  # 16 s a generation


def test_a_request_naming_no_steps_is_planned_at_the_steps_its_engine_ran() -> None:
    """The engine's default (here 20 steps) is learned from a generation of a request that named
    none; later such requests are planned at 20 x the time per step, not at the 4-step time."""
    planner, clock = make(timeout_s=100, max_generations=2)
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 4, steps=4)  # 1 s a step
    assert planner.handle(Admit("A")).refused is None
    planner.handle(TurnEnded("A", 1))
    planner.handle(GenerationQueued("A", "image"))
    planner.handle(GenerationStarted("A"))
    planner.handle(GenerationFinished("A", "image", 20, 20))  # it ran the default, 20 steps
    assert planner.times.default_steps == {"image": 20}
    planner.handle(Released("A"))
    clock.now = 150  # the 20 s generation left the window; 4-step ones are measured since
    measure(planner, reasoner=1)
    measure_steps(planner, "image", 4, steps=4)
    assert planner.times.longest_s == {"image": 4}
    assert planner.handle(Admit("B")).refused is None
    assert planner.plan()[0].finish == pytest.approx(150 + 1 + 20 + 1 + 20 + 1)
