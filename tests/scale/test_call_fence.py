"""The call fence decides, for each call the gateway may ask elsewhere, whether the replica took
it or the gateway gave up on it, whichever came first (no Ray: the actor's class itself)."""

from __future__ import annotations

import time

from sglang_omni.scale.call_fence import RETAIN_S, CallFence


def test_a_call_given_up_is_never_claimed_and_one_claimed_is_never_given_up() -> None:
    fence = CallFence()
    assert fence.give_up("late")  # the replica was silent: the gateway asks another one
    assert not fence.claim("late", time.time())  # the replica resumes: it does not run it
    assert not fence.claim("late", time.time())
    assert fence.claim("taken", time.time())  # the replica took it, then froze
    assert not fence.give_up("taken")  # the gateway does not ask another replica
    assert fence.claim("taken", time.time())  # (a repeated claim of its own call stands)


def test_a_claim_of_a_call_older_than_the_fence_remembers_is_refused() -> None:
    assert not CallFence().claim("ancient", time.time() - RETAIN_S - 1)


def test_a_claimed_call_abandoned_is_never_settled_and_one_settled_is_never_abandoned() -> None:
    fence = CallFence()
    assert fence.claim("frozen", time.time())  # the replica took it, then froze
    assert fence.abandon("frozen")  # the gateway answers its client with the silence error
    assert not fence.settle("frozen")  # the replica resumes: it drops the call
    assert fence.claim("sent", time.time())
    assert fence.settle("sent")  # its answer left just before the freeze
    assert not fence.abandon("sent")  # the gateway waits for it instead
    assert fence.settle("sent")


def test_abandoning_a_call_no_replica_took_gives_it_up() -> None:
    fence = CallFence()
    assert fence.abandon("never taken")
    assert not fence.claim("never taken", time.time())
    assert not fence.settle("never taken")
