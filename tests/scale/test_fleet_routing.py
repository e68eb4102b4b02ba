"""Routing in a fleet of two replicas: the deadline router sends a request to the replica whose
plan admits it, never to one whose plan would refuse it while the other admits it; a 503 from one
replica is retried on the other before the client sees it (round robin, which does not look at
the plans, shows both: with retries the client never sees the 503, without them it does). A
request no replica admits now waits at the gateway for one that will, unless ``max_wait_s`` is 0
or ``max_waiting`` requests already wait there."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("ray")

from sglang_omni.pipeline.planner import Admit, GenerationFinished, TurnEnded  # noqa: E402
from tests.kit import script, wait_until  # noqa: E402
from tests.planner.kit import make  # noqa: E402
from tests.scale.kit import Fleet, RayCluster, deploy, gateway_metric, settle  # noqa: E402

#: One image of 4 steps of 0.5 s: 2 s on the stage (3 s and more beside two CPU burners).
#: timeout_s 60 fits an idle server's 8 generations (the most a request plans) with 12 s or more
#: to spare at up to 5 s a generation, so an idle replica admits a request whatever the
#: gateway's transit took (a request's deadline counts from its arrival at the gateway, and an
#: idle replica refuses one whose wait ate that spare time: at timeout_s 16 the spare was what
#: was left after the last whole generation, 0.15 s at the 3.1 s a loaded machine measured, and
#: every request that took longer to reach an idle replica was refused there). The busy replica
#: holds one request of LONG_STEPS-step generations: the planner plans it at the measured
#: seconds per step for every generation it may still run, which leaves a new request fewer than
#: 8 for at least 9 s at any such time (9.7-40 s by the planner). The first test checks both.
PLANNED = ("--generation.factory.step_time_s", "0.5", "--orchestrator.factory.timeout_s", "60")
LONG_STEPS = 16
ONE_IMAGE = script({"action": "image", "prompt": "a cube"}, {"action": "final", "text": "ok"})
GEN = {"generation": {"width": 32, "height": 32, "seed": 1}}
#: Pairs of warm-up requests sent at most until both replicas measured a generation.
WARM_ROUNDS = 6


def generate(fleet: Fleet, prompt: str = ONE_IMAGE, params: dict | None = None) -> int:
    return httpx.post(f"{fleet.url}/generate",
                      json={"prompt": prompt, "stage_params": params or GEN},
                      timeout=60).status_code


def warm_both(fleet: Fleet) -> None:
    """Both replicas measure a generation: two requests at once, which the router spreads when
    both are in flight together; on a loaded machine the first may end before the second is
    routed (the router may then send it to the same replica), and a replica starved of CPU past
    replica_silence_s has its call answered 500 by the gateway, so pairs go until both
    measured. The warm-up's answers are in the failure message, not checked: what the tests
    check comes after it."""
    answers: list[int] = []
    for _ in range(WARM_ROUNDS):
        warm = [threading.Thread(target=lambda: answers.append(generate(fleet)))
                for _ in range(2)]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        if wait_until(lambda: all(r["quote"]["generation_s"] for r in fleet.stats()),
                      timeout=5):  # a few stats periods
            return
    raise AssertionError(f"the replicas did not both measure a generation in {WARM_ROUNDS} "
                         f"pairs of requests (answers {answers}): {fleet.stats()}")


def refusals(fleet: Fleet) -> dict[str, int]:
    return {s["replica"]: s["answers"].get("503", 0) for s in fleet.stats()}


def hold(fleet: Fleet, prompt: str, params: dict | None = None) -> threading.Thread:
    """Start a request in a thread; return once a replica holds it."""
    thread = threading.Thread(target=generate, args=(fleet, prompt, params), daemon=True)
    thread.start()
    fleet.wait(lambda stats: any(s["in_flight"] for s in stats), what="a request in flight")
    return thread


@pytest.mark.parametrize("turn_s", [0.05, 1.0])
@pytest.mark.parametrize("generation_s", [2.0, 3.1, 5.0])
def test_the_planned_times_let_an_idle_replica_admit_after_a_slow_transit(
        generation_s: float, turn_s: float) -> None:
    """With PLANNED's timeout at the generation times a quiet or loaded machine measures, an idle
    replica admits a request that took seconds to reach it, and the long request leaves the
    busy replica refusing a new one (the next test needs both)."""
    timeout_s = float(PLANNED[PLANNED.index("--orchestrator.factory.timeout_s") + 1])
    (idle, _), (busy, _) = make(timeout_s, max_generations=8), make(timeout_s, max_generations=8)
    for planner in (idle, busy):
        planner.handle(TurnEnded("warm-up", turn_s))
        planner.handle(GenerationFinished("warm-up", "image", generation_s, steps=4))
    assert idle.handle(Admit("after a transit", waited_s=3.0)).refused is None
    assert busy.handle(Admit("long", steps=LONG_STEPS)).refused is None
    assert busy.quote().refused


def test_the_deadline_router_avoids_a_replica_whose_plan_refuses(cluster: RayCluster) -> None:
    fleet = deploy(cluster, *PLANNED)
    warm_both(fleet)
    stats = fleet.wait(lambda s: all(r["quote"]["generation_s"] for r in s) and s,
                       what="both replicas measured a generation")
    fleet.wait(lambda s: not any(r["in_flight"] or r["planned_in_flight"] or r["stage_jobs"]
                                 for r in s), what="both replicas idle after the warm-up")
    long_gen = {"generation": {**GEN["generation"], "num_inference_steps": LONG_STEPS}}
    busy_long = hold(fleet, ONE_IMAGE, long_gen)
    busy = fleet.wait(lambda s: [r for r in s if r["in_flight"]], what="the long request")[0]
    assert busy["quote"]["refused"], busy["quote"]  # its stage is planned for long generations
    before = refusals(fleet)
    answers = []
    for _ in range(4):  # each once the other replica let the last one go (a loaded machine's
        # release lags its answer: the next request was planned behind it, and refused there too)
        fleet.wait(lambda s: not any(r["in_flight"] or r["planned_in_flight"]
                                     or r["quote"]["active"] for r in s
                                     if r["replica"] != busy["replica"]),
                   what="the other replica idle (its planner's active requests too)")
        answers.append(httpx.post(f"{fleet.url}/generate", json={"prompt": ONE_IMAGE,
                                                                 "stage_params": GEN}, timeout=60))
    if [a.status_code for a in answers] != [200] * 4:  # the whole story, not truncated
        pytest.fail(f"answers {[a.status_code for a in answers]}: "
                    f"{[a.text for a in answers if a.status_code != 200]}; "
                    f"stats when they ended: {fleet.stats()}", pytrace=False)
    assert refusals(fleet) == before, "a request was sent to the replica whose plan refuses it"
    busy_long.join()
    assert len(stats) == 2


@pytest.mark.parametrize("retries", [None, 0])
def test_a_503_is_retried_on_another_replica(cluster: RayCluster, retries: int | None) -> None:
    fleet = deploy(cluster, "--orchestrator.factory.max_active", "1",
                   "--generation.factory.step_time_s", "0.01", router="round_robin",
                   retries=retries)
    long_one = hold(fleet, script({"action": "image", "prompt": "!sleep=3 long"},
                                  {"action": "final", "text": "ok"}))
    codes = [generate(fleet) for _ in range(4)]  # round robin sends half to the busy replica
    refused = sum(refusals(fleet).values())
    assert refused >= 1
    retried = gateway_metric(fleet, "sgl_omni_gateway_retries_total", status="503")
    if retries is None:
        assert codes == [200] * 4  # each 503 retried on the idle replica
        assert retried == refused
    else:
        assert codes.count(503) == refused and codes.count(200) == 4 - refused
        assert retried == 0
    long_one.join()


def fill_both_replicas(fleet: Fleet) -> list[threading.Thread]:
    """Both replicas measure a generation, then each holds a 3 s request (max_active 1)."""
    warm_both(fleet)
    settle(fleet)  # the router sees the measurements too
    long = script({"action": "image", "prompt": "!sleep=3 long"},
                  {"action": "final", "text": "ok"})
    held = [hold(fleet, long)]
    fleet.wait(lambda s: sum(r["in_flight"] for r in s) == 1, what="the first long request")
    held.append(threading.Thread(target=generate, args=(fleet, long), daemon=True))
    held[1].start()
    fleet.wait(lambda s: all(r["in_flight"] for r in s), what="both replicas full")
    return held


@pytest.mark.parametrize("max_wait_s", [30.0, 0.0])
def test_a_request_no_replica_admits_waits_for_one(cluster: RayCluster,
                                                   max_wait_s: float) -> None:
    fleet = deploy(cluster, "--orchestrator.factory.max_active", "1",
                   "--generation.factory.step_time_s", "0.01", max_wait_s=max_wait_s)
    held = fill_both_replicas(fleet)
    before = refusals(fleet)
    sent = time.monotonic()
    waiting: list[float] = []

    def scrape_meanwhile() -> None:
        time.sleep(0.5)
        waiting.append(gateway_metric(fleet, "sgl_omni_gateway_waiting_requests"))

    watch = threading.Thread(target=scrape_meanwhile)
    watch.start()
    code = generate(fleet)
    waited = time.monotonic() - sent
    watch.join()
    if max_wait_s:
        assert waiting == [1.0]  # the gateway's metrics show it waiting there
        # held at the gateway until a long request ended, then admitted: no replica refused it
        assert code == 200 and waited > 1.0, (code, waited)
        assert refusals(fleet) == before
    else:  # refused, not held: a held request would have been admitted once one ended (200),
        # and the gateway's gauge never counted it (a loaded machine's 503 can take seconds)
        assert code == 503 and waiting == [0.0], (code, waiting)
    for t in held:
        t.join()


def test_beyond_max_waiting_a_request_is_refused_at_once(cluster: RayCluster) -> None:
    fleet = deploy(cluster, "--orchestrator.factory.max_active", "1",
                   "--generation.factory.step_time_s", "0.01", max_waiting=1)
    held = fill_both_replicas(fleet)
    answers: list[tuple[int, float]] = []

    def timed() -> None:
        sent = time.monotonic()
        code = generate(fleet)
        answers.append((code, time.monotonic() - sent))

    waiting = threading.Thread(target=timed)
    waiting.start()
    # the first one is in the gateway's waiting room (its one place)
    assert wait_until(lambda: gateway_metric(fleet, "sgl_omni_gateway_waiting_requests") == 1,
                      timeout=30)
    timed()
    waiting.join()
    refused, admitted = answers  # the second request's answer comes first
    assert refused[0] == 503 and refused[1] < 2.0, answers
    assert admitted[0] == 200 and admitted[1] > 1.0, answers
    for t in held:
        t.join()


def test_a_reused_client_rid_is_refused_as_on_one_server(cluster: RayCluster) -> None:
    # Round robin would send each next request to the other replica: only the gateway's pin
    # takes a reused id to the replica that knows it.
    fleet = deploy(cluster, "--generation.factory.step_time_s", "0.01", router="round_robin")

    def with_rid(rid: str, prompt: str = ONE_IMAGE, **extra: object) -> httpx.Response:
        return httpx.post(f"{fleet.url}/generate", timeout=60,
                          json={"prompt": prompt, "rid": rid, "stage_params": GEN, **extra})

    long = script({"action": "image", "prompt": "!sleep=2 long"},
                  {"action": "final", "text": "ok"})
    first: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: first.append(with_rid("dup-1", long)))
    thread.start()
    fleet.wait(lambda s: any(r["in_flight"] for r in s), what="the first request in flight")
    for _ in range(2):
        again = with_rid("dup-1")
        assert again.status_code == 400, again.text
        assert "already in use by a request in flight" in again.json()["error"]["message"]
    thread.join()
    assert first[0].status_code == 200, first[0].text
    for _ in range(2):
        later = with_rid("dup-1")
        assert later.status_code == 400, later.text
        assert "was used by a request that ended" in later.json()["error"]["message"]
    # an id whose request was refused is free again, on any replica
    refused = with_rid("free-1", stage_params={"generation": {"width": -1}})
    assert refused.status_code == 400, refused.text
    assert [with_rid("free-1").status_code] == [200]
