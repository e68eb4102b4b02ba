"""How long a fleet read may still wait for the replicas: its whole bound counts from its
arrival at the gateway, less what the merge and the answer keep (pure code)."""

from __future__ import annotations

import time

from sglang_omni.scale.fleet_answers import MIN_WAIT_S, REPLY_S, replica_wait


def test_a_fleet_read_waits_for_the_replicas_only_within_its_whole_bound() -> None:
    now = time.monotonic()
    assert abs(replica_wait(1.5, now) - (1.5 - REPLY_S)) < 0.05
    assert abs(replica_wait(1.5, now - 1.0) - (0.5 - REPLY_S)) < 0.05
    assert replica_wait(1.5, now - 5.0) == MIN_WAIT_S
