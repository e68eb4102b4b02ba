"""Item 3 of the native chat stage: sizing (native server arguments) and admission."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.engines.native.server_args import ServerArgsError, resolve_server_args
from sglang_omni.errors import ConfigError, ServiceUnavailable
from sglang_omni.pipeline.admission.chat import ChatAdmission
from tests.chat.kit import CHAT, TEXT_ONLY, chat, media_host, say, script
from tests.kit import wait_until
from tests.server import Server

SLOW = {"delay_s": 30}


def active_requests(server: Server) -> float:
    """``sgl_omni_active_requests`` of ``server`` (HTTP requests being served)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(r"^sgl_omni_active_requests (\S+)$", text, re.M)
    assert found, "no sgl_omni_active_requests in /metrics"
    return float(found.group(1))


def spec(budget: float | None = None, **engine: object) -> EngineSpec:
    return EngineSpec(stage="reasoner", role="reasoner", backend="native", model_path="/ckpt",
                      gpu=0, gpu_memory_fraction=budget, factory={}, engine=dict(engine))


def logged_server_args(server: Server) -> dict:
    match = re.search(r"native server arguments \(.*?\): (\{.*\})", server.log())
    assert match, server.log()
    return json.loads(match.group(1))


# --- sizing -----------------------------------------------------------------------------------
def test_defaults_leave_sizing_to_native() -> None:
    args = resolve_server_args(spec())
    assert args.kwargs == {"model_path": "/ckpt"} and not args.warnings


def test_placement_budget_becomes_the_memory_fraction() -> None:
    args = resolve_server_args(spec(0.45))
    assert args.kwargs == {"model_path": "/ckpt", "mem_fraction_static": 0.45}
    assert not args.warnings


def test_engine_arguments_pass_through_and_an_explicit_fraction_wins() -> None:
    args = resolve_server_args(spec(0.45, mem_fraction_static=0.8, context_length=32768,
                                    max_running_requests=4))
    assert args.kwargs == {"model_path": "/ckpt", "mem_fraction_static": 0.8,
                           "context_length": 32768, "max_running_requests": 4}
    assert len(args.warnings) == 1 and "wins over" in args.warnings[0]
    assert "0.8" in args.warnings[0] and "0.45" in args.warnings[0]


@pytest.mark.parametrize("key", ["model_path", "tool_call_parser", "reasoning_parser"])
def test_engine_arguments_omni_cannot_serve_refused(key: str) -> None:
    with pytest.raises(ServerArgsError, match=f"stages.reasoner.engine.{key}"):
        resolve_server_args(spec(**{key: "x"}))


def test_media_limit_follows_the_native_argument() -> None:
    assert resolve_server_args(spec()).media_url_max_file_size_mb == 64
    assert resolve_server_args(spec(media_url_max_file_size_mb=2)).media_url_max_file_size_mb == 2
    with pytest.raises(ServerArgsError, match="media_url_max_file_size_mb"):
        resolve_server_args(spec(media_url_max_file_size_mb=-1))


def test_stage_logs_its_native_server_arguments_and_the_warning() -> None:
    with Server(*TEXT_ONLY, "--reasoner.gpu_memory_fraction", "0.5", "--mem-fraction-static",
                "0.7", "--reasoner.engine.context_length", "32768") as server:
        assert logged_server_args(server) == {
            "model_path": "/models/Cosmos3-Nano", "mem_fraction_static": 0.7,
            "context_length": 32768}
        assert re.search(r"WARNING stages\.reasoner\.engine\.mem_fraction_static 0\.7 .*wins "
                         r"over the placement budget stages\.reasoner\.gpu_memory_fraction "
                         r"0\.5", server.log())


def test_budget_alone_is_the_memory_fraction_over_http() -> None:
    with Server(*TEXT_ONLY, "--reasoner.gpu_memory_fraction", "0.35") as server:
        assert logged_server_args(server)["mem_fraction_static"] == 0.35
        assert "wins over" not in server.log()


def test_refused_engine_argument_fails_startup() -> None:
    server = Server(*TEXT_ONLY, "--reasoner.engine.reasoning_parser", "qwen3", wait_ready=False)
    try:
        assert server.proc.wait(60) != 0
        assert "stages.reasoner.engine.reasoning_parser" in server.log()
    finally:
        server.stop()


# --- admission --------------------------------------------------------------------------------
def test_admission_counts_against_the_sum() -> None:
    admission = ChatAdmission.from_engine("reasoner", {"max_running_requests": 2,
                                                       "max_queued_requests": 1})
    tickets = [admission.enter() for _ in range(3)]
    with pytest.raises(ServiceUnavailable, match="max_running_requests 2 .* max_queued_requests 1"):
        admission.enter()
    tickets[0].release()
    tickets[0].release()  # idempotent
    assert admission.in_flight == 2
    admission.enter()


@pytest.mark.parametrize("engine", [{}, {"max_running_requests": 1},
                                    {"max_queued_requests": 1}])
def test_native_admission_unless_both_limits_are_set(engine: dict) -> None:
    admission = ChatAdmission.from_engine("reasoner", engine)
    assert admission.limit is None
    for _ in range(100):
        admission.enter()


@pytest.mark.parametrize("value", [0, -1, "2", 1.5, True])
def test_invalid_limit_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="stages.reasoner.engine.max_queued_requests"):
        ChatAdmission.from_engine("reasoner", {"max_running_requests": 1,
                                               "max_queued_requests": value})


def test_invalid_limit_stops_startup_with_exit_code_2() -> None:
    server = Server(*TEXT_ONLY, "--reasoner.engine.max_running_requests", "0",
                    "--reasoner.engine.max_queued_requests", "1", wait_ready=False)
    try:
        assert server.proc.wait(60) == 2
        assert "stages.reasoner.engine.max_running_requests" in server.log()
    finally:
        server.stop()


class OpenStream:
    """A streaming request held open (its first line read) until closed."""

    def __init__(self, server: Server, body: dict) -> None:
        self.client = httpx.Client(timeout=30)
        self.cm = self.client.stream("POST", f"{server.url}{CHAT}", json=body)
        self.response = self.cm.__enter__()
        self.status = self.response.status_code
        self.lines = self.response.iter_lines()  # dropping the iterator closes the stream
        if self.status == 200:
            next(self.lines)

    def close(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()


@pytest.fixture(scope="module")
def bounded() -> Iterator[Server]:
    with Server(*TEXT_ONLY, "--reasoner.engine.max_running_requests", "1",
                "--reasoner.engine.max_queued_requests", "1",
                "--allowed-media-domain", "127.0.0.1") as srv:  # the loopback media host
        yield srv


@pytest.mark.parametrize("stream", [False, True])
def test_503_beyond_the_sum_before_media_is_loaded(bounded: Server, stream: bool) -> None:
    with ExitStack() as stack, media_host() as host:
        for _ in range(2):  # max_running_requests 1 + max_queued_requests 1
            held = OpenStream(bounded, {"stream": True, "messages": say("slow", **SLOW)})
            stack.callback(held.close)
            assert held.status == 200
        content = [{"type": "text", "text": "look"},
                   {"type": "image_url", "image_url": {"url": f"{host.url}/cube.png"}}]
        resp = chat(bounded, {"stream": stream,
                              "messages": [{"role": "user", "content": content}]})
        assert resp.status_code == 503, resp.text
        error = resp.json()["error"]
        assert error["type"] == "service_unavailable" and error["code"] == 503
        assert "max_running_requests 1 + max_queued_requests 1" in error["message"]
        assert host.paths == []  # refused before any media was loaded
    # the held requests were closed: their admission is released, media loads again
    with media_host() as host:
        content = [{"type": "text", "text": script({"action": "final", "text": "{media}"})},
                   {"type": "image_url", "image_url": {"url": f"{host.url}/cube.png"}}]
        assert wait_until(lambda: chat(bounded, {
            "messages": [{"role": "user", "content": content}]}).status_code == 200)
        assert host.paths == ["/cube.png"]


def test_admission_released_by_completion_failure_and_disconnect(bounded: Server) -> None:
    for _ in range(3):  # completed requests release their admission
        assert chat(bounded, {"messages": say("ok")}).status_code == 200
    failing = [{"role": "user", "content": script({"error": {"status": 500, "message": "x"}})}]
    for _ in range(3):  # and so do failed ones
        assert chat(bounded, {"messages": failing}).status_code == 500
    for _ in range(3):  # and non-streaming requests whose client went away
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{bounded.url}{CHAT}", json={"messages": say("slow", **SLOW)},
                       timeout=0.5)
    assert wait_until(lambda: chat(bounded, {"messages": say("ok")}).status_code == 200)
    # every abandoned request has ended on the server (one free slot, seen above, is not both:
    # a loaded machine notices the last disconnect later)
    assert wait_until(lambda: active_requests(bounded) == 0)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(
        chat(bounded, {"messages": say("ok", delay_s=0.5)}).status_code)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200, 200]


def test_native_admission_by_default_queues_everything() -> None:
    with Server(*TEXT_ONLY) as server, ExitStack() as stack:
        held = [OpenStream(server, {"stream": True, "messages": say("slow", **SLOW)})
                for _ in range(6)]
        for h in held:
            stack.callback(h.close)
        assert [h.status for h in held] == [200] * 6
