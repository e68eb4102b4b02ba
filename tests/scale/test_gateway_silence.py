"""The gateway tells a frozen replica from a slow answer (no Ray cluster: a scripted call): a
call whose replica sends keep-alives for longer than the silence limit is relayed whole, one
that brings nothing for the limit fails naming the replica's silence, and the routers of the
gateway's process pass that replica over from then on."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

pytest.importorskip("ray")

from sglang_omni.config.server import ServerSettings  # noqa: E402
from sglang_omni.scale import silent_replicas  # noqa: E402
from sglang_omni.scale.asgi_call import KEEPALIVE, STREAM_END  # noqa: E402
from sglang_omni.scale.call_fence import CallFence  # noqa: E402
from sglang_omni.scale.gateway import OmniGateway, ReplicaSilent  # noqa: E402
from sglang_omni.scale.routers import excluded  # noqa: E402
from sglang_omni.scale.silent_replicas import TAKEN, UNFENCED, not_retried  # noqa: E402

SILENCE_S = 0.3
ANSWER = [{"type": "http.response.start", "status": 200, "headers": []},
          {"type": "http.response.body", "body": b"ok", "more_body": False}]


class ScriptedCall:
    """A replica call's stream: its items, each after ``gap_s`` (the first after ``first_s``
    when given); then, if ``hang``, nothing."""

    def __init__(self, items: list[Any], gap_s: float, hang: bool = False,
                 first_s: float | None = None) -> None:
        self.items, self.gap_s, self.hang = list(items), gap_s, hang
        self.next_gap_s = gap_s if first_s is None else first_s

    async def __anext__(self) -> Any:
        if not self.items:
            if self.hang:
                await asyncio.Event().wait()
            raise StopAsyncIteration
        await asyncio.sleep(self.next_gap_s)
        self.next_gap_s = self.gap_s
        return self.items.pop(0)


def gateway() -> OmniGateway:
    return OmniGateway(None, ServerSettings(), retries=0, replica_count=2,  # type: ignore[arg-type]
                       replica_silence_s=SILENCE_S)


async def relayed(call: ScriptedCall, replica: str) -> list[Any]:
    return [m async for batch in gateway()._batches(call, replica)  # type: ignore[arg-type]
            for m in batch]


def test_keepalives_keep_a_slow_answer_going() -> None:
    # eight keep-alives, 0.1 s apart: 0.8 s with nothing but keep-alives, over the 0.3 s limit
    call = ScriptedCall([KEEPALIVE] * 8 + [ANSWER, STREAM_END], gap_s=0.1)
    assert asyncio.run(relayed(call, "slow")) == ANSWER
    assert "slow" not in silent_replicas.silent()


def test_a_silent_replica_fails_its_call_and_is_passed_over() -> None:
    call = ScriptedCall([ANSWER[:1]], gap_s=0.0, hang=True)
    began = time.monotonic()
    with pytest.raises(ReplicaSilent, match=r"\(frozen1\) stopped answering: nothing came "
                                            r"from it for 0.3 s"):
        asyncio.run(asyncio.wait_for(relayed(call, "frozen1"), 10))
    assert time.monotonic() - began < 5
    assert "frozen1" in silent_replicas.silent()
    assert "frozen1" in excluded(None)  # the routers leave it out, as a replica that refused



def test_a_replica_logs_that_it_was_frozen(caplog: pytest.LogCaptureFixture) -> None:
    """After SIGCONT the replica's log names the freeze (what follows, such as its stages'
    exits, is the freeze's doing); a punctual tick logs nothing. The clock is scripted: a
    punctual second, then one 8.5 s late."""
    from sglang_omni.scale.replica import _watch_freezes

    ticks = iter([0.0, 1.0, 1.0, 10.5, 10.5])

    async def watch() -> None:
        task = asyncio.ensure_future(_watch_freezes(lambda: next(ticks)))
        while "frozen" not in caplog.text:
            await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level("WARNING", logger="sglang_omni.scale"):
        asyncio.run(asyncio.wait_for(watch(), 10))
    assert [r.getMessage() for r in caplog.records] == [
        "this replica was frozen for 8.5 s (its process stopped or its event loop blocked): "
        "the gateway failed the requests it was serving ('the replica ... stopped answering') "
        "and passes it over; stage exits that follow are the freeze's doing"]


# --- a replica that never sends its first reply ---------------------------------------------
class ScriptedHandle:
    """The replicas' handle: each ``call.remote`` answers with the next scripted call, and
    plays the router: the call is noted as sent to the replica named with it (None: the
    router holds it, as the deadline router does while no replica admits it)."""

    def __init__(self, calls: list[tuple[str | None, ScriptedCall]]) -> None:
        self.calls = calls
        self.kwargs: list[dict[str, Any]] = []

    def options(self, **_: Any) -> ScriptedHandle:
        return self

    @property
    def call(self) -> ScriptedHandle:
        return self

    def remote(self, _request: dict[str, Any], **kwargs: Any) -> ScriptedCall:
        from sglang_omni.scale import routed_calls

        self.kwargs.append(kwargs)
        replica, call = self.calls.pop(0)
        routed_calls.chose(kwargs["call_id"], (replica,) if replica else ())
        call.cancel = lambda: None  # type: ignore[attr-defined]
        return call


class LocalFence:
    """The gateway's fence actor, in-process: ``give_up.remote`` answers as the actor would;
    ``claimed`` are the calls a replica claims as soon as they are made."""

    def __init__(self, claim_all: bool = False) -> None:
        self.fence = CallFence()
        self.claim_all = claim_all

    @property
    def give_up(self) -> LocalFence:
        return self

    async def remote(self, token: str) -> bool:
        if self.claim_all:
            self.fence.claim(token, time.time())
        return self.fence.give_up(token)


def relay_through(handle: ScriptedHandle, retries: int, fence: LocalFence | None = None
                  ) -> list[dict[str, Any]]:
    gw = OmniGateway(handle, ServerSettings(), retries=retries,  # type: ignore[arg-type]
                     replica_count=2, replica_silence_s=SILENCE_S)
    gw.fence = (fence, "serve") if fence is not None else None
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": []}
    asyncio.run(asyncio.wait_for(gw._relay(scope, {}, send, time.time()), 10))
    return sent


def test_a_call_sent_to_a_replica_that_never_replies_is_asked_of_another() -> None:
    frozen = ScriptedCall([], gap_s=0.0, hang=True)  # not even the replica's id comes
    served = ScriptedCall(["replica-b", ANSWER, STREAM_END], gap_s=0.0)
    handle = ScriptedHandle([("frozen2", frozen), ("replica-b", served)])
    began = time.monotonic()
    assert relay_through(handle, retries=1, fence=LocalFence()) == ANSWER
    assert SILENCE_S <= time.monotonic() - began < 5
    assert handle.kwargs[1]["exclude"] == ["frozen2"]  # the retry avoids it
    assert handle.kwargs[0]["fence"] == handle.kwargs[1]["fence"]  # each call fenced
    assert handle.kwargs[0]["call_id"] != handle.kwargs[1]["call_id"]
    assert "frozen2" in silent_replicas.silent()


@pytest.mark.parametrize("fence", [LocalFence(claim_all=True), None],
                         ids=["the replica took it", "no fence"])
def test_a_silent_call_that_may_run_is_not_asked_of_another(fence: LocalFence | None) -> None:
    frozen = ScriptedCall([], gap_s=0.0, hang=True)
    handle = ScriptedHandle([("frozen4", frozen)])
    sent = relay_through(handle, retries=1, fence=fence)
    assert sent[0]["status"] == 500 and len(handle.kwargs) == 1
    why = TAKEN if fence is not None else UNFENCED
    assert json.loads(sent[1]["body"])["error"]["message"] == not_retried("frozen4", SILENCE_S,
                                                                          why)


def test_with_no_retry_left_the_silence_is_the_answer() -> None:
    handle = ScriptedHandle([("frozen3", ScriptedCall([], gap_s=0.0, hang=True))])
    sent = relay_through(handle, retries=0)
    assert sent[0]["status"] == 500
    assert b"(frozen3) stopped answering" in sent[1]["body"]


def test_a_request_the_router_holds_is_not_silence() -> None:
    # the deadline router holds it (sends it nowhere) for 4x the silence limit, then a replica
    # admits it and answers at once
    held = ScriptedCall(["replica-c", ANSWER, STREAM_END], gap_s=0.0, first_s=4 * SILENCE_S)
    handle = ScriptedHandle([(None, held)])
    assert relay_through(handle, retries=0) == ANSWER
    assert "replica-c" not in silent_replicas.silent()


def test_a_silent_replica_is_taken_back_once_it_records_its_stats_again() -> None:
    silent_replicas.mark("thawed")
    marked = time.time()
    silent_replicas.heard_from("thawed", marked - 5)  # its stats from before the freeze
    assert "thawed" in excluded(None)
    silent_replicas.heard_from("thawed", marked + 0.5)  # recorded after the mark: it runs
    assert "thawed" not in excluded(None)


def test_a_retried_refusal_is_logged_with_what_the_replica_said(
        caplog: pytest.LogCaptureFixture) -> None:
    """A 503 is retried on another replica, so its client never sees it: the gateway's log
    line of the retry carries the refusal's message (why the replica refused)."""
    said = b'{"error": {"message": "server.max_active 1 requests are running", "code": 503}}'
    refused = ScriptedCall(["replica-d", [
        {"type": "http.response.start", "status": 503, "headers": []},
        {"type": "http.response.body", "body": said, "more_body": False}], STREAM_END],
        gap_s=0.0)
    served = ScriptedCall(["replica-e", ANSWER, STREAM_END], gap_s=0.0)
    handle = ScriptedHandle([("replica-d", refused), ("replica-e", served)])
    with caplog.at_level("INFO", logger="sglang_omni"):
        assert relay_through(handle, retries=1) == ANSWER
    retry = [r.getMessage() for r in caplog.records if "asking another replica" in r.getMessage()]
    assert len(retry) == 1 and "replica-d" in retry[0], retry
    assert "server.max_active 1 requests are running" in retry[0], retry
