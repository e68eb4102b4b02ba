"""The other two pipelines through a fleet of two replicas: text-only chat answers as one server
does; direct generation's images answer as one server's, a video job made on one replica is
found, fetched and deleted through the fleet whichever replica each call reaches, and the
WebSocket routes are closed with a reason (not relayed)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")

from sglang_omni.scale.gateway import WEBSOCKET_REFUSAL  # noqa: E402
from tests.scale.kit import RayCluster, deploy  # noqa: E402
from tests.scale.test_fleet_routes import answer  # noqa: E402
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, Server  # noqa: E402

DIRECT = Path(__file__).parent.parent / "direct-scripted.yaml"
VOLATILE = {"id", "created", "created_at", "inference_time_s"}


def same(got: tuple[int, str, Any], want: tuple[int, str, Any]) -> bool:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return got[:2] == want[:2] and strip(got[2]) == strip(want[2])


@pytest.fixture(scope="module")
def single_chat() -> Iterator[Server]:
    with Server(*SCRIPTED_CHAT) as srv:
        yield srv


@pytest.fixture(scope="module")
def single_direct() -> Iterator[Server]:
    with Server(*SCRIPTED_GENERATION) as srv:
        yield srv


def test_text_only_chat(cluster: RayCluster, single_chat: Server) -> None:
    fleet = deploy(cluster, *SCRIPTED_CHAT[1:], config=None, text_only=True)
    for n, (method, path, kwargs) in enumerate([
        ("POST", "/v1/chat/completions", {"json": {"messages": [
            {"role": "user", "content": "hello"}], "rid": "c1", "seed": 1}}),
        ("POST", "/v1/chat/completions", {"json": {"messages": [
            {"role": "user", "content": "hello"}], "rid": "c2", "stream": True}}),
        ("POST", "/v1/chat/completions", {"json": {"messages": []}}),
        ("POST", "/generate", {"json": {"prompt": "hi"}}),
        ("GET", "/v1/models", {}),
    ]):
        got, want = (answer(httpx.request(method, f"{base}{path}", timeout=30, **kwargs))
                     for base in (fleet.url, single_chat.url))
        assert same(got, want), (n, got, want)


def test_direct_generation(cluster: RayCluster, single_direct: Server) -> None:
    fleet = deploy(cluster, config=DIRECT)
    image = {"prompt": "a red cube", "size": "48x32", "seed": 3}
    got, want = (answer(httpx.post(f"{base}/v1/images/generations", json=image, timeout=30))
                 for base in (fleet.url, single_direct.url))
    assert got[0] == 200 and same(got, want)
    # A video job lives on one replica; every call about it finds it.
    jobs = {s["replica"]: s["stages"]["generation"]["jobs"]["submitted"] for s in fleet.stats()}
    job = httpx.post(f"{fleet.url}/v1/videos", json={"prompt": "a wave", "size": "32x32",
                                                     "num_frames": 5, "fps": 5}, timeout=30)
    assert job.status_code == 200
    video = job.json()["id"]
    deadline = time.monotonic() + 30
    while True:
        status = httpx.get(f"{fleet.url}/v1/videos/{video}", timeout=10)
        assert status.status_code == 200, status.text
        if status.json()["status"] in ("completed", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status.json()["status"] == "completed"
    for _ in range(12):  # whichever replica the router picks first (at random: they tie)
        content = httpx.get(f"{fleet.url}/v1/videos/{video}/content", timeout=10)
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    stats = fleet.by_id()
    holder = [r for r, s in stats.items()
              if s["stages"]["generation"]["jobs"]["submitted"] > jobs[r]]
    others = [s["answers"].get("4xx", 0) for r, s in stats.items() if r not in holder]
    assert len(holder) == 1 and others[0] >= 1  # the other replica was asked first at times
    assert httpx.delete(f"{fleet.url}/v1/videos/{video}", timeout=10).json()["status"] \
        == "deleted"
    gone = httpx.get(f"{fleet.url}/v1/videos/{video}", timeout=10)
    assert gone.status_code == 404 and video in gone.json()["error"]["message"]


def test_websockets_are_closed_with_a_reason(cluster: RayCluster) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    fleet = deploy(cluster, config=DIRECT, replicas=1)
    with connect(fleet.url.replace("http", "ws") + "/v1/actions/realtime") as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == WEBSOCKET_REFUSAL
