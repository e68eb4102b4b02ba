"""A frozen replica (its server process stopped: SIGSTOP, or an event loop that never yields)
answers neither requests nor Ray's health check. The gateway hears nothing from its call, not
even the replica's keep-alive: the in-flight request ends within the gateway's silence limit
(6 s) with an error naming the silence (a stream: ``event: error`` and ``[DONE]``), not after
Ray's 60 s, and new requests go to the other replica. Ray replaces it once its health checks
fail; its stage processes, hearing no heartbeat from it, exit with their children, and the
replacement serves."""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

pytest.importorskip("ray")

from sglang_omni.scale.gateway import REPLICA_SILENCE_S  # noqa: E402
from sglang_omni.scale.silent_replicas import replica_silent  # noqa: E402
from tests.scale.kit import Fleet, RayCluster, deploy  # noqa: E402
from tests.scale.test_fleet_faults import (  # noqa: E402
    GEN,
    Call,
    gone,
    held,
    processes,
    wait_first_call,
)

CHECK_S = 1.0
#: The gateway's silence limit, and slack for a loaded machine (the issue's bound is 10 s).
ENDS_WITHIN_S = REPLICA_SILENCE_S + 6
#: New requests avoid the frozen replica once a call found it silent.
NOTICED_WITHIN_S = ENDS_WITHIN_S + 10
#: A stage whose server sent no heartbeat for twice its stall timeout, and at least 10 s
#: (stage.process.MIN_SERVER_SILENCE_S), exits: with STALL_S of 5 s, 10 s after the freeze
#: (with the default 30 s, 60 s: later than Ray's graceful wait ends, so the test raced it).
STALL_S = 5.0
STAGES_EXIT_WITHIN_S = 10 + 15


def test_a_frozen_replica_is_replaced_and_its_request_ends(cluster: RayCluster) -> None:
    fleet: Fleet = deploy(cluster, "--generation.factory.step_time_s", "0.01",
                          "--reasoner.factory.stall_timeout_s", str(STALL_S),
                          "--generation.factory.stall_timeout_s", str(STALL_S),
                          router="round_robin", health_check_s=CHECK_S)
    before = fleet.by_id()
    mine = Call(fleet.url, held(60), stream=True)
    first, second = wait_first_call(fleet)
    victim = before[first]
    # Its answer has started (a call the replica took but had not answered when it froze is
    # not asked elsewhere either: it fails with 500 at once, test_fleet_freeze_retry).
    deadline = time.monotonic() + 30
    while mine.status is None:
        assert time.monotonic() < deadline, "the stream's answer never started"
        time.sleep(0.05)
    frozen_process = psutil.Process(victim["pid"])  # never a later process given its pid
    stages = processes([stage["pid"] for stage in victim["stages"].values()])
    frozen_process.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    # Requests sent now may be routed to it (no call found it silent yet): one the frozen
    # replica never replies to is asked of the other once the silence limit passed, and served.
    fresh = [Call(fleet.url, held(0), stream=True) for _ in range(3)]
    try:
        mine.join(ENDS_WITHIN_S)
        assert not mine.is_alive(), "the frozen replica's request never ended"
        assert mine.ended - frozen < ENDS_WITHIN_S
        assert mine.status == 200
        events = mine.events()
        assert events[-1] == ("message", "[DONE]") and events[-2][0] == "error", events
        assert events[-2][1] == {"message": replica_silent(first, REPLICA_SILENCE_S),
                                 "type": "server_error", "code": 500}
        for call in fresh:
            call.join(ENDS_WITHIN_S)
            assert not call.is_alive(), "a request sent to the frozen replica never ended"
            assert call.status == 200 and call.events()[-1] == ("message", "[DONE]")
            assert not [e for e in call.events() if e[0] == "error"], call.events()
        # The gateway passes it over from then on: requests all succeed.
        deadline = frozen + NOTICED_WITHIN_S
        streak = 0
        while streak < 4:
            assert time.monotonic() < deadline, "requests still reach the frozen replica"
            try:
                ok = httpx.post(f"{fleet.url}/generate", json={"prompt": held(0),
                                                               "stage_params": GEN}, timeout=2)
                streak = streak + 1 if ok.status_code == 200 else 0
            except httpx.TimeoutException:  # sent to the frozen replica
                streak = 0
        # Its stages hear no heartbeat from it: they exit with their children, so their GPUs
        # are freed whether or not Ray ever kills the stopped process.
        for stage in stages:
            deadline = frozen + STAGES_EXIT_WITHIN_S
            while not gone(stage) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert gone(stage), stage
        after = fleet.wait(lambda stats: len(stats) == 2
                           and first not in {s["replica"] for s in stats}
                           and all(s["health"] == "ok" for s in stats) and stats,
                           timeout=60, what="a replacement replica")
        assert second in {s["replica"] for s in after}
    finally:
        try:  # Ray may not have killed the stopped process yet
            frozen_process.kill()
        except psutil.NoSuchProcess:
            pass
