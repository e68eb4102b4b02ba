"""``sgl-omni replicas`` lists a replica that does not answer instead of dropping it, and exits 1.

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


def _fake_cluster(monkeypatch: pytest.MonkeyPatch, refs: dict[str, str]) -> None:
    prefix = f"{launch.REPLICA_ACTOR_PREFIX}omni#OmniReplica#"

    def get(ref: str, timeout: float) -> Any:
        if ref == "stuck":
            raise ray.exceptions.GetTimeoutError("timed out")
        if ref == "dead":
            raise ray.exceptions.RayActorError()
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
    assert lines[1] == "bbbb no answer in 10 s"
    assert lines[2].startswith("cccc unreachable (RayActorError")
    assert launch.replica_stats() == [ANSWER]


def test_all_answering_exits_0(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    _fake_cluster(monkeypatch, {"aaaa": "ok"})
    assert launch.print_replicas("auto", "omni") == 0
    assert "generations 1; stage free in 0.0 s, admits 4" in capsys.readouterr().out
