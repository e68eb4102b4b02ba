"""The other two pipelines through a fleet of two replicas: text-only chat answers as one server
does; direct generation's images answer as one server's, a video job made on one replica is
found, fetched and deleted through the fleet whichever replica each call reaches, and the
WebSocket sessions are relayed to one replica each (closed with 1011 if it dies)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

pytest.importorskip("ray")

from sglang_omni.scale.gateway import SESSION_LOST  # noqa: E402
from tests.generation.test_realtime_ws import ACTION, INIT, closed_code, recv  # noqa: E402
from tests.scale.kit import RayCluster, deploy, settle, whole_read  # noqa: E402
from tests.scale.test_fleet_routes import answer  # noqa: E402
from tests.server import SCRIPTED_CHAT, SCRIPTED_GENERATION, Server  # noqa: E402

DIRECT = Path(__file__).parent.parent / "direct-scripted.yaml"


def ws(fleet: Any, path: str) -> ClientConnection:
    return connect(fleet.url.replace("http", "ws") + path, open_timeout=20)
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


def test_the_video_list_holds_every_replicas_jobs(cluster: RayCluster) -> None:
    fleet = deploy(cluster, config=DIRECT)
    before = {s["replica"]: s["stages"]["generation"]["jobs"]["submitted"]
              for s in fleet.stats()}
    made: list[str] = []
    for _ in range(8):  # until both replicas hold a job (the router spreads them by load)
        job = httpx.post(f"{fleet.url}/v1/videos", json={"prompt": "a wave", "size": "32x32",
                                                         "num_frames": 3}, timeout=30)
        assert job.status_code == 200
        made.append(job.json()["id"])
        held = {s["replica"] for s in fleet.stats()
                if s["stages"]["generation"]["jobs"]["submitted"] > before[s["replica"]]}
        if len(held) == 2:
            break
    assert len(held) == 2
    job = httpx.post(f"{fleet.url}/v1/videos", json={"prompt": "a wave", "size": "32x32",
                                                     "num_frames": 3}, timeout=30)
    made.append(job.json()["id"])  # three jobs at least: more than one page of two replicas'
    for _ in range(3):  # whichever replica is asked first
        listed = whole_read(fleet.url, "/v1/videos")
        assert listed.status_code == 200
        body = listed.json()
        ids = [job["id"] for job in body["data"]]
        assert set(made) <= set(ids) and len(ids) == len(set(ids))
        assert body["first_id"] == ids[0] and body["last_id"] == ids[-1]
        created = [job["created_at"] for job in body["data"]]
        assert created == sorted(created, reverse=True)
    # Pages of one job, each replica's jobs among them: the fleet's list, in its order.
    paged: list[str] = []
    query: dict[str, str | int] = {"limit": 1}
    while True:
        page = whole_read(fleet.url, "/v1/videos", query).json()
        paged += [job["id"] for job in page["data"]]
        if not page["has_more"]:
            break
        query["after"] = page["last_id"]
    assert paged == ids
    asc = whole_read(fleet.url, "/v1/videos", {"order": "asc"}).json()
    assert [job["id"] for job in asc["data"]] == ids[::-1]
    refused = httpx.get(f"{fleet.url}/v1/videos", params={"limit": "0"}, timeout=10)
    assert refused.status_code == 400 and "limit" in refused.json()["error"]["message"]


def test_websocket_sessions_are_relayed(cluster: RayCluster) -> None:
    """Both WebSocket routes through a fleet answer as one server's: messages in order, the
    app's errors and close codes; two realtime-video sessions at once (one server takes one)
    each get a replica."""
    fleet = deploy(cluster, "--generation.factory.step_time_s", "0.02", config=DIRECT)
    with ws(fleet, "/v1/actions/realtime") as conn:
        meta = recv(conn)
        assert meta["object"] == "action.metadata"
        conn.send(msgpack.packb(ACTION))
        first = recv(conn)
        conn.send(msgpack.packb(ACTION))
        second = recv(conn)
        assert first["object"] == second["object"] == "action.generation"
        assert set(second["server_timing"]) == {"infer_ms", "prev_total_ms"}
        conn.send(b"\xc1")
        error = recv(conn)
        assert "not valid msgpack" in error["error"] and closed_code(conn) == 1011
    with ws(fleet, "/v1/realtime_video/generate") as one:
        one.send(msgpack.packb({**INIT, "max_chunks": 40}))
        assert recv(one)["type"] == "frame_batch"
        fleet.wait(lambda s: sum(r["in_flight"] for r in s) == 1, what="the first session")
        settle(fleet)  # the router sees it
        with ws(fleet, "/v1/realtime_video/generate") as two:  # one server would refuse it
            two.send(msgpack.packb({**INIT, "max_chunks": 2}))
            chunks = [recv(two), recv(two)]
            assert [c["type"] for c in chunks] == ["frame_batch"] * 2, chunks
            assert [c["chunk_index"] for c in chunks] == [0, 1]
            assert closed_code(two) == 1000
        assert recv(one)["type"] == "frame_batch"


def test_a_websocket_session_whose_replica_dies_is_closed_with_a_reason(
        cluster: RayCluster) -> None:
    fleet = deploy(cluster, config=DIRECT, replicas=1)
    with ws(fleet, "/v1/realtime_video/generate") as conn:
        conn.send(msgpack.packb({**INIT, "num_inference_steps": 1000}))
        victim = fleet.wait(lambda s: [r for r in s if r["in_flight"]], what="the session")[0]
        os.kill(victim["pid"], signal.SIGKILL)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                conn.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1011 and closed.value.rcvd.reason == SESSION_LOST
