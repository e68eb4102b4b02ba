"""The native tier: ``NativeReasoner`` against the real sglang 0.5.23 chat classes on the CPU.

The real ``OpenAIServingChat``, ``ChatCompletionRequest`` and ``GenerateReqInput`` run over a
fake tokenizer manager (``fakes.py``), as sglang's own CPU tests do; only the engine's processes
and the model are fakes. Run with ``pytest -m native tests/native`` where the ``native`` extra
is installed; elsewhere the module is skipped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("sglang", reason="the native tier needs the pinned sglang (native extra)")

from sglang.test.test_utils import maybe_stub_sgl_kernel  # noqa: E402

maybe_stub_sgl_kernel()

from sglang.srt.entrypoints.http_server import MINIMUM_PNG_PICTURE_BASE64  # noqa: E402
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest  # noqa: E402
from sglang.srt.managers.tokenizer_manager import ServerStatus  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.test_utils import published_topology  # noqa: E402

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.native.reasoner import NativeReasoner  # noqa: E402
from sglang_omni.engines.native.server_args import resolve_server_args  # noqa: E402
from sglang_omni.errors import BadRequest, MediaRefused, NativeRefusal  # noqa: E402
from sglang_omni.pipeline.chat_request import (  # noqa: E402
    LENGTH_STOP_FIELDS,
    OUTPUT_FIELDS,
    SAMPLING_FIELDS,
)
from tests.chat.kit import data_url, media_host, png  # noqa: E402
from tests.native.fakes import GENERATION_CONFIG, FakeEngine  # noqa: E402

pytestmark = pytest.mark.native

PNG_BYTES = png((9, 9, 9))


@pytest.fixture(autouse=True)
def topology() -> Iterator[None]:
    """The runtime context a real Engine publishes (OpenAIServingChat reads it)."""
    with published_topology():
        yield


def spec(engine: dict[str, Any] | None = None, media: dict[str, Any] | None = None,
         budget: float | None = None) -> EngineSpec:
    return EngineSpec(stage="reasoner", role="reasoner", backend="native",
                      model_path="/models/Cosmos3-Nano", gpu=0, gpu_memory_fraction=budget,
                      factory={},
                      engine=dict({"skip_server_warmup": True} if engine is None else engine),
                      media_policy=media or {})


def make(engine: dict[str, Any] | None = None, multimodal: bool = True, children: int = 0,
         media: dict[str, Any] | None = None, budget: float | None = None) -> NativeReasoner:
    return NativeReasoner(spec(engine, media, budget),
                          engine_factory=lambda kw: FakeEngine(kw, multimodal, children))


def job(messages: list[dict], stream: bool = False, rid: str = "r1", **payload: Any
        ) -> tuple[Job, list[dict]]:
    chunks: list[dict] = []
    body = {"messages": messages, "sampling": {}, "stream": stream, "turn_index": 0,
            **payload}
    return Job(rid, body, [], emit=chunks.append), chunks


def user(text: str, *parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def run(coro_fn) -> Any:  # noqa: ANN001
    return asyncio.run(coro_fn())


# --- startup, sizing and warmup ---------------------------------------------------------------
def test_engine_gets_the_resolved_server_args_and_real_server_args_accept_them() -> None:
    engine = {"mem_fraction_static": 0.6, "context_length": 32768, "max_running_requests": 4,
              "max_queued_requests": 8, "skip_server_warmup": True,
              "media_url_max_file_size_mb": 16}
    reasoner = make(engine, budget=0.4)

    async def scenario() -> dict:
        await reasoner.start()
        return reasoner.engine.kwargs

    kwargs = run(scenario)
    assert kwargs == {"model_path": "/models/Cosmos3-Nano", **engine}
    assert reasoner.policy.max_file_size_mb == 16
    native = ServerArgs(**kwargs)  # every key is a real native server argument
    assert (native.mem_fraction_static, native.context_length) == (0.6, 32768)
    assert (native.max_running_requests, native.max_queued_requests) == (4, 8)
    budget_only = resolve_server_args(spec({}, budget=0.3)).kwargs
    assert ServerArgs(**budget_only).mem_fraction_static == 0.3


def test_start_sends_sglang_serves_multimodal_warmup_before_ready() -> None:
    reasoner = make({})

    async def scenario() -> Any:
        await reasoner.start()
        return reasoner.engine.tokenizer_manager

    tm = run(scenario)
    assert tm.loop_attached == 1
    assert len(tm.requests) == 1  # the warmup, sent by start() (the stage is ready after it)
    warmup = tm.requests[0]
    assert [i.url for i in warmup.image_data] == [
        f"data:image/png;base64,{MINIMUM_PNG_PICTURE_BASE64}"]
    assert "Describe the image." in warmup.text
    assert warmup.sampling_params["temperature"] == 0.0
    assert warmup.sampling_params["max_new_tokens"] == 8
    assert warmup.stream is False
    assert tm.server_status == ServerStatus.Up


@pytest.mark.parametrize("engine,multimodal", [({}, False),
                                               ({"language_model_only": True}, True)])
def test_text_warmup_for_a_text_only_engine(engine: dict, multimodal: bool) -> None:
    reasoner = make(engine, multimodal=multimodal)
    run(reasoner.start)
    (warmup,) = reasoner.engine.tokenizer_manager.requests
    assert warmup.text == "The capital city of France is"
    assert warmup.sampling_params == {"temperature": 0, "max_new_tokens": 8}


def test_skip_server_warmup_sends_nothing() -> None:
    reasoner = make({"skip_server_warmup": True})
    run(reasoner.start)
    tm = reasoner.engine.tokenizer_manager
    assert tm.requests == [] and tm.server_status == ServerStatus.Up


# --- requests ---------------------------------------------------------------------------------
def test_non_streaming_request_through_the_real_chat_service(tmp_path: Path) -> None:
    reasoner = make(media={"allowed_local_media_path": str(tmp_path)})
    (tmp_path / "cube.png").write_bytes(PNG_BYTES)
    messages = user("describe", {"type": "image_url", "image_url": {
                        "url": str(tmp_path / "cube.png")}},
                    {"type": "video_url", "video_url": {"url": "omni-frame://0"}},
                    {"type": "audio_url", "audio_url": {"url": data_url("audio/wav", b"RIFF")}})
    the_job, chunks = job(messages, sampling={"temperature": 0.2, "max_tokens": 7},
                          stage_params={"ignore_eos": True})
    the_job.frames.append(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 16)

    async def scenario() -> Any:
        await reasoner.start()
        return await reasoner.run(the_job)

    result = run(scenario)
    assert result.payload == {"text": "hi there", "finish_reason": "stop", "usage": {
        "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    assert chunks == []
    (obj,) = reasoner.engine.tokenizer_manager.requests
    assert obj.rid.startswith("omni-") and obj.rid != "r1" and obj.stream is False
    params = obj.sampling_params
    # set by the client, from stage_params, and from the checkpoint's generation config
    assert (params["temperature"], params["max_new_tokens"], params["ignore_eos"]) == (
        0.2, 7, True)
    assert (params["top_p"], params["top_k"]) == (GENERATION_CONFIG["top_p"],
                                                  GENERATION_CONFIG["top_k"])
    assert [i.url for i in obj.image_data] == [(tmp_path / "cube.png").resolve().as_uri()]
    video, audio = obj.video_data[0], obj.audio_data[0]
    assert urlsplit(video).path.endswith(".mp4") and audio.startswith("file://")
    assert not Path(urlsplit(audio).path).exists()  # the turn's files removed at its end
    assert Path(urlsplit(video).path).exists()  # the request's frame: until the request ends
    reasoner.end_request("r1")
    assert not Path(urlsplit(video).path).exists()


def test_sampling_left_out_comes_from_the_generation_config() -> None:
    reasoner = make()

    async def scenario() -> Any:
        await reasoner.start()
        return await reasoner.run(job(user("hello"))[0])

    run(scenario)
    params = reasoner.engine.tokenizer_manager.requests[0].sampling_params
    assert {k: params[k] for k in GENERATION_CONFIG} == GENERATION_CONFIG


def test_streaming_request_consumes_natives_sse() -> None:
    reasoner = make()
    the_job, chunks = job(user("hello"), stream=True)

    async def scenario() -> Any:
        await reasoner.start()
        return await reasoner.run(the_job)

    result = run(scenario)
    assert chunks == [{"text": ""}, {"text": "hi"}, {"text": " there"}]
    assert result.payload == {"text": "hi there", "finish_reason": "stop", "usage": {
        "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    assert reasoner.engine.tokenizer_manager.requests[0].stream is True


def test_logprobs_are_asked_for_without_stream() -> None:
    reasoner = make()

    async def scenario() -> Any:
        await reasoner.start()
        return await reasoner.run(job(user("hello"), options={"logprobs": True,
                                                              "top_logprobs": 2})[0])

    result = run(scenario)
    obj = reasoner.engine.tokenizer_manager.requests[0]
    assert obj.return_logprob is True and obj.top_logprobs_num == 2
    tokens = result.payload["logprobs"]["content"]
    assert [(t["token"], t["logprob"]) for t in tokens] == [("hi", -0.1), (" there", -0.2)]


def test_omni_forwards_only_native_field_names() -> None:
    forwarded = SAMPLING_FIELDS + LENGTH_STOP_FIELDS + OUTPUT_FIELDS
    assert set(forwarded) <= set(ChatCompletionRequest.model_fields)


@pytest.mark.parametrize("stage_params,needle", [
    ({"top_k": "many"}, "top_k"),
    ({"temperature": "hot"}, "temperature"),
    ({"tempature": 0.5}, "stage_params.reasoner.tempature: not a native chat request field"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_invalid_native_fields_are_400(stage_params: dict, needle: str, stream: bool) -> None:
    reasoner = make()

    async def scenario() -> None:
        await reasoner.start()
        await reasoner.run(job(user("hello"), stream=stream, stage_params=stage_params)[0])

    with pytest.raises(BadRequest, match=needle) as refused:
        run(scenario)
    assert refused.value.status == 400
    assert reasoner.engine.tokenizer_manager.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_native_validation_refusal_maps_to_400(stream: bool) -> None:
    """A request native's own validation refuses (an ORJSONResponse) keeps status 400."""
    reasoner = make()
    bad_format = {"type": "json_schema", "json_schema": {"name": "x"}}

    async def scenario() -> None:
        await reasoner.start()
        await reasoner.run(job(user("hello"), stream=stream, response_format=bad_format)[0])

    with pytest.raises(NativeRefusal, match="schema_ is required") as refused:
        run(scenario)
    assert (refused.value.status, refused.value.type) == (400, "invalid_request_error")


@pytest.mark.parametrize("stream", [False, True])
def test_native_queue_full_maps_to_503(stream: bool) -> None:
    reasoner = make()

    async def scenario() -> None:
        await reasoner.start()
        await reasoner.run(job(user("QUEUE-FULL"), stream=stream)[0])

    with pytest.raises(NativeRefusal, match="The request queue is full") as refused:
        run(scenario)
    assert (refused.value.status, refused.value.type) == (503, "service_unavailable")


def test_refused_media_never_reaches_native(tmp_path: Path) -> None:
    reasoner = make(media={"allowed_local_media_path": str(tmp_path)})
    messages = user("x", {"type": "image_url", "image_url": {"url": "file:///etc/hosts"}})

    async def scenario() -> None:
        await reasoner.start()
        await reasoner.run(job(messages)[0])

    with pytest.raises(MediaRefused, match="must resolve inside|outside"):
        run(scenario)
    assert reasoner.engine.tokenizer_manager.requests == []


def test_allowlisted_media_is_fetched_by_omni_and_handed_over_as_a_file() -> None:
    with media_host() as host:
        reasoner = make(media={"allowed_media_domain": ["127.0.0.1"]})
        messages = user("x", {"type": "image_url", "image_url": {"url": f"{host.url}/c.png"}})

        async def scenario() -> Any:
            await reasoner.start()
            return await reasoner.run(job(messages)[0])

        run(scenario)
        assert host.paths == ["/c.png"]
    (obj,) = reasoner.engine.tokenizer_manager.requests
    assert obj.image_data[0].url.startswith("file://")


# --- aborts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_cancelled_job_aborts_the_native_request_by_id(stream: bool) -> None:
    reasoner = make()
    the_job, chunks = job(user("SLOW"), stream=stream)

    async def scenario() -> tuple[str, list[str], list[str]]:
        await reasoner.start()
        tm = reasoner.engine.tokenizer_manager
        task = asyncio.create_task(reasoner.run(the_job))
        await asyncio.wait_for(tm.started.wait(), 30)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return tm.requests[0].rid, list(tm.aborted), list(tm.cancelled)

    rid, aborted, cancelled = run(scenario)
    assert aborted == [rid] and cancelled == [rid]  # at once: by the time the task ended
    if stream:
        assert chunks[:2] == [{"text": ""}, {"text": "wait"}]


# --- native processes -------------------------------------------------------------------------
def test_watch_reports_a_dead_native_child_and_close_shuts_native_down() -> None:
    reasoner = make(children=2)

    async def scenario() -> str:
        await reasoner.start()
        watch = asyncio.ensure_future(reasoner.watch())
        await asyncio.sleep(0.3)
        assert not watch.done()
        reasoner.engine.children[1].kill()
        message = await asyncio.wait_for(watch, 10)
        await reasoner.close()
        return message

    message = run(scenario)
    victim = reasoner.engine.children[1]
    assert message.startswith(f"the native SGLang detokenizer process {victim.pid} exited")
    assert "cannot serve" in message
    assert reasoner.engine.shut_down and not any(c.is_alive() for c in reasoner.engine.children)


def test_sigquit_from_a_native_child_wakes_the_watch() -> None:
    assert threading.current_thread() is threading.main_thread()
    reasoner = make(children=1)

    async def scenario() -> str:
        await reasoner.start()
        watch = asyncio.ensure_future(reasoner.watch())
        await asyncio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGQUIT)  # what a failing scheduler sends its parent
        reasoner.engine.children[0].kill()
        message = await asyncio.wait_for(watch, 10)
        await reasoner.close()
        return message

    message = run(scenario)
    assert "scheduler process" in message and "exited" in message


def test_native_reasoner_asks_the_server_to_stop_when_its_stage_exits() -> None:
    assert NativeReasoner.stops_server_on_exit is True
