"""Faults in a fleet of two replicas (round robin, so each request's replica is known): a
replica killed with ``kill -9`` mid-request fails its own requests with a clear error (a stream
ends with ``event: error`` and ``[DONE]``) while the other replica's requests finish, and Ray
replaces it (listed as starting while its stages start); a client that disconnects aborts its
request down to the generation stage; a replica whose ``/health`` turns unhealthy is passed over
and replaced."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import httpx
import psutil
import pytest

pytest.importorskip("ray")

from sglang_omni.engines.native.lifecycle import running  # noqa: E402
from sglang_omni.scale.gateway import REPLICA_DIED  # noqa: E402
from tests.kit import parse_sse, script  # noqa: E402
from tests.scale.kit import Fleet, RayCluster, deploy  # noqa: E402

GEN = {"generation": {"width": 32, "height": 32, "seed": 3}}
ENDS_WITHIN_S = 5.0


def held(seconds: float) -> str:
    """A request whose one generation takes ``seconds``."""
    return script({"action": "image", "prompt": f"!sleep={seconds} held"},
                  {"action": "final", "text": "done"})


@pytest.fixture(scope="module")
def fleet(cluster: RayCluster) -> Fleet:
    # The generation stage is never restarted: its death leaves the replica unhealthy for good.
    # The Reasoner takes 3 s to start, so a replacement replica is seen starting.
    return deploy(cluster, "--generation.factory.step_time_s", "0.01",
                  "--generation.factory.max_restarts", "0",
                  "--reasoner.factory.start_delay_s", "3", router="round_robin")


class Replacement(threading.Thread):
    """Polls the fleet's stats until both replicas are ok and ``gone`` is not among them:
    ``after`` (those stats, None past 60 s), ``starting`` (replicas seen listed as starting)."""

    def __init__(self, fleet: Fleet, gone: str) -> None:
        super().__init__(daemon=True)
        self.fleet, self.gone = fleet, gone
        self.starting: set[str] = set()
        self.seen: list[list[dict[str, Any]]] = []
        self.after: list[dict[str, Any]] | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stats = self.fleet.stats()
            self.seen.append(stats)
            self.starting.update(s["replica"] for s in stats if s["health"] == "starting")
            if len(stats) == 2 and self.gone not in {s["replica"] for s in stats} \
                    and all(s["health"] == "ok" for s in stats):
                self.after = stats
                return
            time.sleep(0.1)


class Call(threading.Thread):
    """One request in a thread: ``status``, ``text`` and when it ``ended`` (monotonic)."""

    def __init__(self, url: str, prompt: str, stream: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.stream = url, stream
        self.body = {"prompt": prompt, "stream": stream, "stage_params": GEN}
        self.status: int | None = None
        self.text = ""
        self.ended = 0.0
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", f"{self.url}/generate", json=self.body, timeout=60) as resp:
            self.status = resp.status_code
            self.text = resp.read().decode()
        self.ended = time.monotonic()

    def events(self) -> list[tuple[str, Any]]:
        return parse_sse(self.text)


def in_flight(fleet: Fleet) -> dict[str, int]:
    return {s["replica"]: s["in_flight"] for s in fleet.stats()}


def wait_first_call(fleet: Fleet) -> tuple[str, str]:
    """Until one replica holds the first call and the other none: (its id, the other's id).
    Which replica round robin starts with depends on the calls Ray routed before (its turn
    counter is the router's, not the test's), so the test asks instead of assuming."""
    counts = fleet.wait(lambda stats: (
        {s["replica"]: s["in_flight"] for s in stats}
        if len(stats) == 2 and sorted(s["in_flight"] for s in stats) == [0, 1] else None),
        what="one call in flight on one replica")
    first = next(replica for replica, n in counts.items() if n == 1)
    return first, next(replica for replica in counts if replica != first)


def wait_counts(fleet: Fleet, want: dict[str, int]) -> None:
    """Until the replicas' in-flight counts are ``want`` (replica id -> calls)."""
    fleet.wait(lambda stats: {s["replica"]: s["in_flight"] for s in stats} == want,
               what=f"in flight {want}")


def processes(pids: list[int]) -> list[psutil.Process]:
    """Processes to watch die, taken while they run: a pid the kernel gives to another process
    later (pids wrap at 32768 here) is not mistaken for one of them."""
    return [psutil.Process(pid) for pid in pids]


def gone(proc: psutil.Process) -> bool:
    return not running(proc)


def test_kill_9_of_a_replica_fails_only_its_requests_and_ray_replaces_it(fleet: Fleet) -> None:
    before = fleet.by_id()
    mine_stream = Call(fleet.url, held(6), stream=True)
    first, second = wait_first_call(fleet)  # round robin then alternates
    victim = before[first]
    theirs_stream = Call(fleet.url, held(3), stream=True)
    wait_counts(fleet, {first: 1, second: 1})
    mine_plain = Call(fleet.url, held(6), stream=False)
    wait_counts(fleet, {first: 2, second: 1})
    theirs_plain = Call(fleet.url, held(3), stream=False)
    wait_counts(fleet, {first: 2, second: 2})

    stages = processes([stage["pid"] for stage in victim["stages"].values()])
    # The replacement's stats are watched from the kill on: its stages start in a few seconds
    # (the Reasoner's start_delay_s), while the calls below may take as long to end.
    watch = Replacement(fleet, first)
    os.kill(victim["pid"], signal.SIGKILL)
    killed = time.monotonic()
    watch.start()
    for call in (mine_stream, mine_plain, theirs_stream, theirs_plain):
        call.join(30)
    # The victim's requests end promptly with the error a dead server process gives.
    assert mine_stream.status == 200
    events = mine_stream.events()
    assert events[-1] == ("message", "[DONE]") and events[-2][0] == "error", events
    assert events[-2][1] == {"message": REPLICA_DIED, "type": "server_error", "code": 500}
    assert mine_plain.status == 500
    assert httpx.Response(500, content=mine_plain.text).json() == {
        "error": {"message": REPLICA_DIED, "type": "server_error", "code": 500}}
    assert max(mine_stream.ended, mine_plain.ended) - killed < ENDS_WITHIN_S
    # The other replica's requests are untouched.
    assert theirs_stream.status == 200 and theirs_stream.events()[-2][0] == "complete"
    assert theirs_plain.status == 200 and "done" in theirs_plain.text
    # Its stage processes die with it; Ray starts a replacement.
    for stage in stages:
        deadline = time.monotonic() + 10
        while not gone(stage) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(stage), stage
    watch.join(70)
    after = watch.after
    assert after is not None, f"no replacement replica within 60 s: {watch.seen[-3:]}"
    assert second in {s["replica"] for s in after}
    # While its stages started, the replacement was listed as starting (not as unreachable).
    assert watch.starting == {s["replica"] for s in after} - {second}
    assert httpx.post(f"{fleet.url}/generate", json={"prompt": held(0), "stage_params": GEN},
                      timeout=30).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_disconnect_aborts_the_generation(fleet: Fleet, stream: bool) -> None:
    def aborted() -> dict[str, int]:
        return {s["replica"]: s["stages"]["generation"]["jobs"]["aborted"]
                for s in fleet.stats()}

    def submitted() -> int:
        return sum(s["stages"]["generation"]["jobs"]["submitted"] for s in fleet.stats())

    before, jobs = aborted(), submitted()
    body = {"prompt": held(30), "stream": stream, "stage_params": GEN}
    if stream:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{fleet.url}/generate", json=body) as response:
                assert response.status_code == 200
                fleet.wait(lambda _: submitted() > jobs, what="the generation started")
            # leaving the block closes the connection mid-generation
    else:
        # The answer comes only at the end: the client gives up waiting after 3 s.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{fleet.url}/generate", json=body, timeout=httpx.Timeout(60, read=3))
        assert submitted() > jobs
    fleet.wait(lambda stats: sum(aborted().values()) == sum(before.values()) + 1
               and all(s["in_flight"] == 0 for s in stats), timeout=ENDS_WITHIN_S,
               what="the generation aborted")


def test_an_unhealthy_replica_is_passed_over_then_replaced(fleet: Fleet) -> None:
    stats = fleet.by_id()
    sick_id = sorted(stats)[0]
    os.kill(stats[sick_id]["stages"]["generation"]["pid"], signal.SIGKILL)
    fleet.wait(lambda s: any(r["replica"] == sick_id and r["health"] == "unhealthy" for r in s),
               what="/health unhealthy (no restart allowed)")
    codes = [httpx.post(f"{fleet.url}/generate", json={"prompt": held(0), "stage_params": GEN},
                        timeout=30).status_code for _ in range(4)]
    assert codes == [200] * 4  # round robin passes the unhealthy replica over
    fleet.wait(lambda s: len(s) == 2 and sick_id not in {r["replica"] for r in s}
               and all(r["health"] == "ok" for r in s), timeout=150,  # a replica's start, loaded
               what="Ray replaced the unhealthy replica")
