"""The SDK against a real server with the scripted engines."""

from __future__ import annotations

import json

import pytest

from sglang_omni.client import Client, OmniClientError
from sglang_omni.client.types import UMMCompletionResult, UMMGenerateChunk
from tests.kit import metric, script, wait_until
from tests.server import SCRIPTED_UMM, Server

SMALL = {"generation": {"width": 32, "height": 32, "num_frames": 5}}


@pytest.fixture(scope="module")
def server():
    with Server(*SCRIPTED_UMM, "--generation.factory.step_time_s", "0.05") as srv:
        yield srv


def test_completion_returns_segments(server: Server) -> None:
    with Client(server.url) as client:
        result = client.completion(
            [{"role": "user", "content": script({"action": "image", "prompt": "cube"},
                                                 {"action": "final", "text": "done"})}],
            stage_params=SMALL)
    assert isinstance(result, UMMCompletionResult)
    assert [s.kind for s in result.segments] == ["image", "text"]
    assert [s.segment_index for s in result.segments] == [0, 1]
    assert result.text == "done" and result.segments[1].text == "done"
    assert result.segments[0].media.content().startswith(b"\x89PNG")


def test_generate_stream_yields_chunks(server: Server) -> None:
    with Client(server.url) as client:
        chunks = list(client.generate(script({"action": "video", "prompt": "wave"},
                                             {"action": "final", "text": "ok"}),
                                      stream=True, stage_params=SMALL))
    assert all(isinstance(c, UMMGenerateChunk) for c in chunks)
    assert [c.event for c in chunks] == ["segment", "segment", "complete"]
    assert chunks[0].segment.kind == "video" and chunks[1].segment.text == "ok"
    assert chunks[2].finish_reason == "stop"
    assert [s.segment_index for s in chunks[2].segments] == [0, 1]
    assert chunks[2].segments[0].data is None  # references carry no data


def test_generate_non_streaming_matches_stream(server: Server) -> None:
    entries = ({"action": "image", "prompt": "a"}, {"action": "final", "text": "b"})
    with Client(server.url) as client:
        whole = client.generate(script(*entries), stage_params=SMALL)
        streamed = [c.segment for c in client.generate(script(*entries), stream=True,
                                                       stage_params=SMALL) if c.segment]
    assert [(s.kind, s.data) for s in whole.segments] == [(s.kind, s.data) for s in streamed]


def test_top_level_field_sent_only_when_not_default(server: Server) -> None:
    ask = script({"action": "final", "text": "{sampling}"})
    with Client(server.url) as client:
        default = client.generate(ask, temperature=1.0)
        chosen = client.generate(ask, temperature=0.5, max_tokens=7)
    assert json.loads(default.text) == {"temperature": 0.0}
    assert json.loads(chosen.text) == {"temperature": 0.5}


def test_errors_raise_with_status(server: Server) -> None:
    with Client(server.url) as client:
        with pytest.raises(OmniClientError) as err:
            client.generate("x", stage_params={"generation": {"output_path": "/tmp/x"}})
        assert err.value.status == 400 and "output_path" in err.value.message
        with pytest.raises(OmniClientError) as err:
            list(client.generate(script({"action": "image", "prompt": "!no-media x"}),
                                 stream=True, stage_params=SMALL))
        assert err.value.status == 500


def test_closing_iterator_early_aborts_generation(server: Server) -> None:
    before = metric(server, "generation", "aborted")
    submitted = metric(server, "generation", "submitted", default=0)
    with Client(server.url) as client:
        chunks = client.generate(
            script({"action": "image", "prompt": "first"},
                   {"action": "image", "prompt": "!sleep=30 slow"},
                   {"action": "final", "text": "never"}),
            stream=True, stage_params=SMALL)
        first = next(chunks)
        assert first.segment.kind == "image"
        # the second generation is running now
        assert wait_until(lambda: metric(server, "generation", "submitted") >= submitted + 2)
        chunks.close()
        wait_until(lambda: metric(server, "generation", "aborted") >= before + 1, timeout=10)
    assert metric(server, "generation", "aborted") == before + 1


def test_generate_streams_progress_when_asked(server: Server) -> None:
    ask = script({"action": "image", "prompt": "a"}, {"action": "final", "text": "b"})
    with Client(server.url) as client:
        chunks = list(client.generate(ask, stream=True, progress=True, stage_params=SMALL))
        plain = list(client.generate(ask, stream=True, stage_params=SMALL))
        with pytest.raises(TypeError, match="stream=True"):
            client.generate(ask, progress=True)
    progress = [c.progress for c in chunks if c.event == "progress"]
    assert {p["stage"] for p in progress} == {"reasoner", "generation"}
    assert [c.event for c in chunks if c.event != "progress"] == ["segment", "segment",
                                                                  "complete"]
    assert all(c.event != "progress" for c in plain)
