"""At most once: the gateway's calls that change state are fenced, so one the gateway gave up on
and asked of another replica never runs on the replica it first went to.

A frozen replica (SIGSTOP, a blocked event loop) resumes where it stopped, possibly in the middle
of admitting a call the gateway gave up on long before; no check on the replica alone is
atomic with that (it may freeze again between the check and the admission), and its clock tells
it nothing about what the gateway decided meanwhile. So the decision is not the replica's: each
gateway keeps a :class:`CallFence` (a Ray actor of its own, which runs one method at a time), and
for each fenced call (its ``call_id`` is the token) exactly one of two things happens there,
whichever comes first:

* the replica **claims** the call (:meth:`CallFence.claim`) before it runs it: from then on the
  gateway's give-up is refused, so the gateway does not ask another replica (the client is told
  the replica stopped answering after it took the request);
* the gateway **gives up** on the call (:meth:`CallFence.give_up`) once the call brought nothing
  for ``replica_silence_s``: from then on the replica's claim is refused, so the replica drops the
  call whenever it resumes, and the gateway asks another replica.

A call the replica claimed and then went silent on (it froze after taking it) is not asked
elsewhere, and its client is told so at once; the replica may still resume and run it, making
what no client knows of (a video job whose id reached no one). So the answer's release is fenced
too, whichever comes first:

* the replica **settles** the call (:meth:`CallFence.settle`) before it lets the answer's first
  message go: from then on the gateway's abandon is refused, and the gateway waits for the
  answer, which is on its way (the replica froze while sending it);
* the gateway **abandons** the call (:meth:`CallFence.abandon`) before it answers the client
  with the silence error: from then on the replica's settle is refused, so the replica drops
  the call when it resumes (stops it, and deletes what it made: a video job is cancelled and
  deleted, never listed).

A replica that cannot reach the fence drops the call (its gateway, the one client of the call,
is gone); a gateway that cannot reach it does not retry. Entries live :data:`RETAIN_S` (a call is
given up within ``replica_silence_s`` of being sent; a claim older than that is refused).
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("sglang_omni.scale")

#: Seconds a fence remembers a call; a claim of a call issued longer ago is refused.
RETAIN_S = 600.0
#: Entries past which a fence drops those older than RETAIN_S.
PRUNE_AT = 10_000
CLAIMED = "claimed"
GIVEN_UP = "given up"
SETTLED = "settled"
ABANDONED = "abandoned"


class CallFence:
    """Which of a gateway's calls a replica took and which the gateway gave up on (pure code;
    :func:`start` runs it as a Ray actor, whose methods run one at a time)."""

    def __init__(self) -> None:
        self._calls: dict[str, tuple[str, float]] = {}  # token -> (state, monotonic time)

    def claim(self, token: str, issued: float) -> bool:
        """A replica is about to run call ``token`` (sent at wall-clock ``issued``): True if it
        may (the gateway has not given up on it), and from then on the gateway cannot."""
        self._prune()
        state = self._calls.get(token)
        if state is not None:
            return state[0] == CLAIMED
        if time.time() - issued > RETAIN_S:
            return False
        self._calls[token] = (CLAIMED, time.monotonic())
        return True

    def give_up(self, token: str) -> bool:
        """The gateway gives up on call ``token``: True if no replica claimed it (and none will
        from now on), False if one did."""
        self._prune()
        state = self._calls.get(token)
        if state is not None:
            return state[0] == GIVEN_UP
        self._calls[token] = (GIVEN_UP, time.monotonic())
        return True

    def settle(self, token: str) -> bool:
        """The replica that claimed call ``token`` is about to release its answer: True if it
        may (the gateway still waits for it), and from then on the gateway cannot abandon it;
        False if the gateway abandoned it (or gave it up): the replica drops the call."""
        self._prune()
        state = self._calls.get(token)
        if state is None:  # pruned long after its claim: nobody abandoned it
            return True
        if state[0] in (CLAIMED, SETTLED):
            self._calls[token] = (SETTLED, state[1])
            return True
        return False

    def abandon(self, token: str) -> bool:
        """The gateway answers call ``token``'s client with an error (its replica went silent):
        True if the replica will drop the call (it has not settled it; a call no replica
        claimed is given up), False if the replica settled it (its answer is on its way)."""
        self._prune()
        state = self._calls.get(token)
        if state is None:
            self._calls[token] = (GIVEN_UP, time.monotonic())
            return True
        if state[0] == SETTLED:
            return False
        if state[0] == CLAIMED:
            self._calls[token] = (ABANDONED, state[1])
        return True

    def held(self) -> int:
        return len(self._calls)

    def _prune(self) -> None:
        if len(self._calls) < PRUNE_AT:
            return
        now = time.monotonic()
        for token in [t for t, (_, at) in self._calls.items() if now - at > RETAIN_S]:
            del self._calls[token]


def start(name: str) -> tuple[Any, str] | None:
    """Start this gateway's fence as a Ray actor named ``name`` (in the caller's namespace; it
    lives as long as the gateway's process): the actor and that namespace, or None outside Ray
    (calls then go unfenced)."""
    try:
        import ray

        if not ray.is_initialized():  # a test's gateway, built outside Ray
            return None
        actor = ray.remote(CallFence).options(name=name, num_cpus=0, max_concurrency=1,
                                              get_if_exists=True).remote()
    except Exception as exc:  # noqa: BLE001 - no Ray here: the gateway does not retry silences
        log.warning("the gateway's call fence did not start (%s): a request whose replica "
                    "goes silent is not asked of another replica", exc)
        return None
    return actor, ray.get_runtime_context().namespace


class FenceClient:
    """A replica's side: claims and settles calls at the fence their gateway named (handles
    cached). An unreachable fence (its gateway is gone: no one waits for the call) answers no."""

    def __init__(self) -> None:
        self._actors: dict[tuple[str, str], Any] = {}

    async def claim(self, fence: str, namespace: str, token: str, issued: float) -> bool:
        """Whether this replica may run the call."""
        return await self._ask(fence, namespace, "claim", token, issued)

    async def settle(self, fence: str, namespace: str, token: str) -> bool:
        """Whether this replica may release the answer of a call it claimed."""
        return await self._ask(fence, namespace, "settle", token)

    async def _ask(self, fence: str, namespace: str, method: str, token: str,
                   *args: Any) -> bool:
        import asyncio

        import ray

        try:
            actor: Any = self._actors.get((fence, namespace))
            if actor is None:
                actor = await asyncio.to_thread(ray.get_actor, fence, namespace)
                self._actors[(fence, namespace)] = actor
            return bool(await getattr(actor, method).remote(token, *args))
        except Exception as exc:  # noqa: BLE001 - its gateway is gone: no one waits for it
            self._actors.pop((fence, namespace), None)
            log.warning("call %s dropped (%s): its gateway's fence %s is unreachable (%s)",
                        token, method, fence, exc)
            return False
