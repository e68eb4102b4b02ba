"""Orchestrator bounds: max_active, max_retained_bytes (history and config), max_outputs."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from sglang_omni.config import load_config, parse_overrides
from sglang_omni.errors import ConfigError
from sglang_omni.models.cosmos3 import Cosmos3UMMPipelineConfig
from tests.kit import metric, wait_until
from tests.server import SCRIPTED_UMM, Server

LARGEST = Cosmos3UMMPipelineConfig.largest_output_bytes(17)


def test_largest_output_is_about_87_mib() -> None:
    assert 85 * 2**20 < LARGEST < 88 * 2**20


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("max_retained_bytes", 64 * 2**20, f"set it to at least {LARGEST}"),
    ("max_outputs", 16, "set it to at least 17"),
])
def test_config_refuses_limits_that_cannot_hold_the_largest_output(
        flag: str, value: int, needle: str) -> None:
    overrides = parse_overrides([f"--orchestrator.factory.{flag}", str(value)])
    with pytest.raises(ConfigError) as err:
        load_config("configs/cpu-scripted.yaml", overrides, visible_gpus=0)
    assert f"stages.orchestrator.factory.{flag}" in str(err.value) and needle in str(err.value)


def test_fewer_dispatches_need_less_room() -> None:
    overrides = parse_overrides(["--orchestrator.factory.max_dispatches", "3",
                                 "--orchestrator.factory.max_retained_bytes", str(24 * 2**20)])
    cfg = load_config("configs/cpu-scripted.yaml", overrides, visible_gpus=0)
    assert cfg.stage("orchestrator").factory["max_retained_bytes"] == 24 * 2**20


def test_serve_refuses_small_max_retained_bytes_at_startup() -> None:
    server = Server(*SCRIPTED_UMM, "--orchestrator.factory.max_retained_bytes", "1000",
                    wait_ready=False)
    try:
        assert server.proc.wait(60) != 0
        assert "stages.orchestrator.factory.max_retained_bytes" in server.log()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tight():
    with Server(*SCRIPTED_UMM, "--orchestrator.factory.max_retained_bytes",
                str(LARGEST + 20_000), "--orchestrator.factory.max_active", "1") as srv:
        yield srv


def test_history_leaving_too_little_room_is_400(tight: Server) -> None:
    long_history = [{"role": "user", "content": "x" * 30_000},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "and now?"}]
    resp = httpx.post(f"{tight.url}/v1/chat/completions", json={"messages": long_history})
    assert resp.status_code == 400
    assert "max_retained_bytes" in resp.json()["error"]["message"]
    short = httpx.post(f"{tight.url}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}]})
    assert short.status_code == 200


def test_request_beyond_max_active_gets_503(tight: Server) -> None:
    slow = json.dumps([{"action": "final", "text": "done", "delay_s": 2}])
    first: dict = {}

    def run_first() -> None:
        first["resp"] = httpx.post(f"{tight.url}/generate", timeout=30,
                                   json={"prompt": f"<omni-script>{slow}</omni-script>"})

    turns = metric(tight, "reasoner", "submitted", default=0)
    thread = threading.Thread(target=run_first)
    thread.start()
    assert wait_until(lambda: metric(tight, "reasoner", "submitted", default=0) > turns), \
        "the first request never reached its turn"  # it holds the one active slot
    second = httpx.post(f"{tight.url}/generate", json={"prompt": "hello"})
    assert second.status_code == 503
    assert "max_active" in second.json()["error"]["message"]
    thread.join(30)
    assert first["resp"].status_code == 200
    assert httpx.post(f"{tight.url}/generate", json={"prompt": "hello"}).status_code == 200
