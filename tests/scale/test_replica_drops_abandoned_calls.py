"""A replica that took a fenced call and, resuming from a freeze, finds that its gateway
abandoned it (the client was answered with the silence error) drops it: the answer goes
nowhere, and the video job it made is cancelled and deleted, so no job exists that no client
knows the id of; so is one made by a call cancelled before its answer left. A call the fence
lets through is answered as usual. The replica runs in this
process, outside Ray (its stages are real processes); the fence is a stand-in that answers as
:class:`~sglang_omni.scale.call_fence.CallFence` does."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve")

from sglang_omni.scale.call_fence import CallFence  # noqa: E402
from sglang_omni.scale.replica import OmniReplica  # noqa: E402
from sglang_omni.scale.spec import ServerSource, plan_replicas  # noqa: E402

DIRECT = Path(__file__).parent.parent / "direct-scripted.yaml"
VIDEO = {"prompt": "a wave", "size": "32x32", "num_frames": 5, "fps": 5}


class Fence:
    """The fence as the replica sees it (FenceClient's methods), over a real CallFence."""

    def __init__(self) -> None:
        self.fence = CallFence()

    async def claim(self, fence: str, namespace: str, token: str, issued: float) -> bool:
        return self.fence.claim(token, issued)

    async def settle(self, fence: str, namespace: str, token: str) -> bool:
        return self.fence.settle(token)


def request(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"method": method, "path": path, "query_string": b"",
            "headers": [(b"content-type", b"application/json")],
            "body": json.dumps(body).encode() if body is not None else b""}


async def answer(replica: OmniReplica, req: dict[str, Any], **fenced: Any
                 ) -> tuple[int | None, bytes]:
    """The status and body the replica's call yields (None: it yielded no answer)."""
    status, body = None, b""
    async for item in replica.call(req, **fenced):
        for message in item if isinstance(item, list) else ():
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body += message.get("body", b"")
    return status, body


@pytest.mark.server
@pytest.mark.timeout(300)
# Python calls the replica's async __del__ (Ray Serve awaits it) again when it collects it
@pytest.mark.filterwarnings("ignore:coroutine 'OmniReplica.__del__' was never awaited")
def test_a_call_abandoned_while_the_replica_was_frozen_leaves_no_job() -> None:
    async def run() -> None:
        plan, _ = plan_replicas(ServerSource.from_file(DIRECT))
        replica = OmniReplica.__new__(OmniReplica)
        await replica.__init__(plan)  # type: ignore[misc]  # Serve awaits it the same way
        fence = Fence()
        replica._fence = fence  # type: ignore[assignment]
        try:
            # Taken before the freeze, abandoned by the gateway during it: dropped at the thaw.
            assert fence.fence.claim("frozen", time.time())
            assert fence.fence.abandon("frozen")
            replica._fence = _ClaimedAlready(fence)  # type: ignore[assignment]
            dropped = await answer(replica, request("POST", "/v1/videos", VIDEO),
                                   call_id="frozen", fence="f", issued=time.time())
            assert dropped == (None, b"")
            replica._fence = fence  # type: ignore[assignment]
            status, body = await answer(replica, request("GET", "/v1/videos"))
            assert status == 200 and json.loads(body)["data"] == [], body
            assert replica.stats.snapshot()["fenced"] == 1
            # A call the gateway still waits for is answered, its job kept.
            status, body = await answer(replica, request("POST", "/v1/videos", VIDEO),
                                        call_id="kept", fence="f", issued=time.time())
            assert status == 200, body
            status, listed = await answer(replica, request("GET", "/v1/videos"))
            assert [j["id"] for j in json.loads(listed)["data"]] == [json.loads(body)["id"]]
            # Cancelled by the gateway while its answer waits at the fence (the call is
            # cancelled at once when the replica resumes): the job it made goes too.
            asked = asyncio.Event()
            replica._fence = _Stuck(asked)  # type: ignore[assignment]
            call = asyncio.ensure_future(answer(replica, request("POST", "/v1/videos", VIDEO),
                                                call_id="cancelled", fence="f",
                                                issued=time.time()))
            await asked.wait()
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            replica._fence = fence  # type: ignore[assignment]
            status, after = await answer(replica, request("GET", "/v1/videos"))
            assert [j["id"] for j in json.loads(after)["data"]] == [json.loads(body)["id"]]
        finally:
            await replica.__del__()

    asyncio.run(run())


class _ClaimedAlready:
    """The replica's claim came before the freeze (it answers yes, as the fence did then); its
    settle is asked of the fence as it is now."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence

    async def claim(self, fence: str, namespace: str, token: str, issued: float) -> bool:
        return True

    async def settle(self, fence: str, namespace: str, token: str) -> bool:
        return await self.fence.settle(fence, namespace, token)


class _Stuck:
    """A fence that lets the call run and never answers its settle (``asked`` set then)."""

    def __init__(self, asked: asyncio.Event) -> None:
        self.asked = asked

    async def claim(self, fence: str, namespace: str, token: str, issued: float) -> bool:
        return True

    async def settle(self, fence: str, namespace: str, token: str) -> bool:
        self.asked.set()
        await asyncio.Event().wait()
        return True
