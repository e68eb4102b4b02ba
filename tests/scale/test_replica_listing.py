"""``sgl-omni replicas`` lists a replica that does not answer instead of dropping it, and exits 1;
a replica still starting (Ray answers its stats call with an error until its server started) is
listed as starting, and the command exits 0.

Ray's actor calls are replaced here (the fleet tests drive the real thing); what is checked is
the listing a user reads when one replica is stuck."""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sglang_omni.scale import launch  # noqa: E402

ANSWER = {"replica": "aaaa", "pid": 7, "health": "ok", "in_flight": 0,
          "answers": {"2xx": 3}, "stages": {"generation": {"jobs": {"completed": 1}}},
          "quote": {"stage_free_in_s": 0.0, "refused": False, "allowance": 4}}


class _Actor:
    def __init__(self, ref: str) -> None:
        self.record_routing_stats = type("M", (), {"remote": staticmethod(lambda: ref)})
        self.was_initialized = type("M", (), {"remote": staticmethod(lambda: "init:" + ref)})


def _fake_cluster(monkeypatch: pytest.MonkeyPatch, refs: dict[str, str]) -> None:
    prefix = f"{launch.REPLICA_ACTOR_PREFIX}omni#OmniReplica#"

    def get(ref: str, timeout: float) -> Any:
        if ref == "stuck":
            raise ray.exceptions.GetTimeoutError("timed out")
        if ref == "dead":
            raise ray.exceptions.RayActorError()
        if ref.startswith("init:"):  # was_initialized
            return ref != "init:starting"
        if ref in ("starting", "broken"):  # Ray's error until the constructor returned
            raise ray.exceptions.RayTaskError(
                "record_routing_stats", "Traceback ...", RuntimeError(
                    "`initialize_callable` must be called before "
                    "`call_user_record_routing_stats`."))
        return ANSWER

    monkeypatch.setattr(launch.ray, "init", lambda **_: None)
    monkeypatch.setattr(launch.ray, "shutdown", lambda: None)
    monkeypatch.setattr(launch.ray.util, "list_named_actors",
                        lambda all_namespaces: [{"name": prefix + r} for r in refs])
    monkeypatch.setattr(launch.ray, "get_actor",
                        lambda name, namespace: _Actor(refs[name.rsplit("#", 1)[-1]]))
    monkeypatch.setattr(launch.ray, "get", get)


def test_a_silent_replica_is_listed_and_the_command_exits_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_cluster(monkeypatch, {"aaaa": "ok", "bbbb": "stuck", "cccc": "dead"})
    assert launch.print_replicas("auto", "omni") == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("aaaa pid 7 ok: in flight 0, answered 2xx 3")
    assert lines[1] == "bbbb no answer in 2 s"
    assert lines[2].startswith("cccc unreachable (RayActorError")
    assert launch.replica_stats() == [ANSWER]


def test_all_answering_exits_0(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    _fake_cluster(monkeypatch, {"aaaa": "ok"})
    assert launch.print_replicas("auto", "omni") == 0
    assert "generations 1; stage free in 0.0 s, admits 4" in capsys.readouterr().out


def test_a_starting_replica_is_listed_as_starting_and_exits_0(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_cluster(monkeypatch, {"aaaa": "ok", "bbbb": "starting"})
    assert launch.print_replicas("auto", "omni") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1] == "bbbb starting: its server is starting its stages"
    assert [s["health"] for s in launch.replica_stats()] == ["ok", "starting"]


def test_an_initialized_replica_whose_stats_call_fails_is_unreachable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_cluster(monkeypatch, {"aaaa": "ok", "bbbb": "broken"})
    assert launch.print_replicas("auto", "omni") == 1
    assert capsys.readouterr().out.strip().splitlines()[1].startswith(
        "bbbb unreachable (RayTaskError")
