"""What the driver checks and ships to replicas: the config as text, the GPU remapping and the
fleet's options; the Serve application builder's arguments. Needs no Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_omni.errors import ConfigError
from sglang_omni.scale.spec import ScaleOptions, ServerSource, plan_replicas

ROOT = Path(__file__).parent.parent.parent
SCRIPTED = ROOT / "configs" / "cpu-scripted.yaml"
GPU_SCRIPTED = {"generation.gpu": 0, "reasoner.gpu": 1}


def test_the_config_travels_as_text_and_resolves_anywhere(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(SCRIPTED.read_text())
    source = ServerSource.from_file(path, {"generation.factory.step_time_s": 0.25},
                                    model_name="m", text_only=False)
    path.unlink()  # replicas never read the driver's file
    config = source.resolve()
    assert config.stage("generation").factory["step_time_s"] == 0.25
    assert source.model_name == "m" and source.options == {"text_only": False}


def test_cpu_stages_ask_for_no_gpu() -> None:
    plan, config = plan_replicas(ServerSource.from_file(SCRIPTED))
    assert plan.gpus == 0 and plan.gpu_overrides == {}
    assert config.config_cls == "Cosmos3UMMPipelineConfig"


@pytest.mark.parametrize(("gpus", "asked", "placed"), [
    ({"generation.gpu": 0, "reasoner.gpu": 1}, 2, {"generation": 0, "reasoner": 1}),
    ({"generation.gpu": 3, "reasoner.gpu": 5}, 2, {"generation": 0, "reasoner": 1}),
    ({"generation.gpu": 2, "reasoner.gpu": 2}, 1, {"generation": 0, "reasoner": 0}),
    ({"generation.gpu": 1, "reasoner.gpu": None}, 1, {"generation": 0, "reasoner": None}),
])
def test_distinct_gpu_indices_become_the_replicas_own(gpus: dict, asked: int,
                                                      placed: dict) -> None:
    """The driver may see no GPU at all: placement is checked where Ray puts the replica."""
    plan, _ = plan_replicas(ServerSource.from_file(SCRIPTED, gpus))
    assert plan.gpus == asked
    with pytest.raises(ConfigError, match="visible"):
        plan.source.resolve(visible_gpus=asked - 1, extra=plan.gpu_overrides)
    config = plan.source.resolve(visible_gpus=asked, extra=plan.gpu_overrides)
    assert {n: config.stage(n).gpu for n in placed} == placed


def test_config_errors_surface_on_the_driver(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        ServerSource.from_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="stages.nope"):
        plan_replicas(ServerSource.from_file(SCRIPTED, {"stages.nope.gpu": 1}))


def test_fleet_options() -> None:
    assert ScaleOptions(replicas=1).retry_limit == 0
    assert ScaleOptions(replicas=3).retry_limit == 2
    assert ScaleOptions(replicas=8).retry_limit == 3
    assert ScaleOptions(replicas=8, retries=0).retry_limit == 0
    for bad in ({"replicas": 0}, {"router": "random"}, {"retries": -1}, {"gateways": 0},
                {"max_wait_s": -1.0}, {"max_wait_s": float("nan")}, {"max_waiting": -1}):
        with pytest.raises(ConfigError):
            ScaleOptions(**bad)


def test_the_serve_application_builder_reads_serve_run_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.serve")
    from ray.serve import Application

    from sglang_omni.scale import builder

    assert isinstance(builder.app_builder({"config": str(SCRIPTED)}), Application)
    built = []
    monkeypatch.setattr(builder, "build", lambda *args: built.append(args))
    builder.app_builder({"config": str(SCRIPTED), "replicas": "3", "router": "round_robin",
                         "text_only": "false", "generation.factory.step_time_s": "0.5",
                         "overrides": {"orchestrator.factory.max_active": 4}})
    source, options = built[0]
    assert options == ScaleOptions(replicas=3, router="round_robin")
    assert source.overrides == {"generation.factory.step_time_s": 0.5,
                                "orchestrator.factory.max_active": 4}
    assert source.options == {"text_only": False}
    with pytest.raises(ConfigError, match="unknown application argument"):
        builder.app_builder({"config": str(SCRIPTED), "replica": 2})
    builder.app_builder({"config": str(SCRIPTED), "max_wait_s": "0", "max_waiting": "8",
                         "log_format": "json"})
    source, options = built[1]
    assert options.max_wait_s == 0.0 and options.max_waiting == 8
    assert source.log_format == "json"
    with pytest.raises(ConfigError, match="log_format"):
        builder.app_builder({"config": str(SCRIPTED), "log_format": "xml"})
    with pytest.raises(ConfigError, match="log_level: expected one of debug, info"):
        builder.app_builder({"config": str(SCRIPTED), "log_level": "loud"})  # not each replica


def test_only_the_deadline_router_takes_the_wait() -> None:
    pytest.importorskip("ray.serve")
    from sglang_omni.scale.builder import router_kwargs

    assert router_kwargs(ScaleOptions(max_wait_s=5.0)) == {"max_wait_s": 5.0}
    assert router_kwargs(ScaleOptions(router="pow2")) == {}


def test_the_waiting_room_has_places_only_where_a_request_may_wait() -> None:
    """No request waits with ``--max-wait-s 0`` or a router that never holds one: the gateway
    then counts none as waiting (its gauge stayed 1 while a refused request travelled)."""
    assert ScaleOptions(max_waiting=7).waiting_places == 7
    assert ScaleOptions(max_waiting=7, max_wait_s=0.0).waiting_places == 0
    assert ScaleOptions(max_waiting=7, router="pow2").waiting_places == 0
    assert ScaleOptions(max_waiting=7, router="round_robin").waiting_places == 0


def test_the_waiting_room_holds_max_waiting_requests() -> None:
    pytest.importorskip("ray.serve")
    from sglang_omni.scale.waiting_room import WaitingRoom

    room = WaitingRoom(2)
    assert [room.enter(), room.enter(), room.enter()] == [True, True, False]
    room.leave()
    assert room.enter() and not room.enter()
    assert not WaitingRoom(0).enter()
