"""An early result (the Reasoner's quick copy of a video, held while the client's MP4 is made)
is taken only while the request can still hold the largest output it may yet produce; otherwise
the controller waits for the final result, so a copy never fails a request against
``max_retained_bytes`` that waiting would have served. The controller is model-agnostic, so a
minimal adapter and stage call drive it here."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sglang_omni.config.stages import MiB
from sglang_omni.contract.result import Frames, StageResult
from sglang_omni.pipeline.umm import (
    TEXT,
    VIDEO,
    Budget,
    Complete,
    Dispatch,
    Limits,
    Output,
    Segment,
    Step,
    UMMController,
    UMMRequest,
)

FINAL = b"F" * (8 * MiB - 64)  # the client's MP4, just under the inline limit


class VideoThenAnswer:
    """Generates one video, shows the Reasoner what the stage handed over, then answers."""

    seen: list[bytes] = []

    def start(self, request: UMMRequest, budget: Budget) -> Step:
        return Step(dispatch=Dispatch("generation", {"modality": VIDEO}, [], modality=VIDEO))

    def advance(self, result: StageResult, budget: Budget) -> Step:
        if result.stage == "reasoner":
            return Step(outputs=(Output(TEXT, text="done"),), finish_reason="stop")
        self.seen.append(bytes(result.frames[0]))
        if result.later is not None:
            later = result.later

            async def client_copy() -> Output:
                final = await later
                return Output(VIDEO, data=final.frames[0], mime_type="video/mp4")

            output = Output(VIDEO, later=client_copy())
        else:
            output = Output(VIDEO, data=result.frames[0], mime_type="video/mp4")
        return Step(outputs=(output,), dispatch=Dispatch("reasoner", {}, list(result.frames)))

    def usage(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def run(copy: bytes) -> tuple[list[Segment | Complete], list[bytes]]:
    VideoThenAnswer.seen = []

    async def call(stage: str, rid: str, payload: Mapping[str, Any],
                   frames: Frames) -> StageResult:
        if stage == "reasoner":
            return StageResult({"text": "ok"}, stage="reasoner")

        async def finish() -> StageResult:
            await asyncio.sleep(0.01)  # the client's MP4, encoded beside the next turn
            return StageResult({}, [FINAL], stage="generation")

        return StageResult({}, [copy], stage="generation",
                           later=asyncio.ensure_future(finish()))

    async def drive() -> list[Segment | Complete]:
        controller = UMMController(
            VideoThenAnswer, Limits(max_dispatches=3, max_outputs=3,
                                    max_retained_bytes=12 * MiB, timeout_s=30), call,
            largest_output_for=lambda dispatches: dispatches * 1024)
        opened = controller.open(UMMRequest(rid="copy-room", messages=[], history_size=0))
        return [event async for event in opened.events()]

    return asyncio.run(drive()), VideoThenAnswer.seen


def test_a_copy_that_fits_is_what_the_next_turn_reads() -> None:
    events, seen = run(copy=b"c" * 1000)
    assert seen == [b"c" * 1000]
    video, text, done = events
    assert isinstance(video, Segment) and video.media == FINAL and video.segment_index == 0
    assert isinstance(done, Complete) and isinstance(text, Segment) and text.text == "done"


def test_a_copy_that_does_not_fit_waits_for_the_final_result() -> None:
    # held beside the 8 MiB MP4's base64 segment, a 2 MiB copy would pass 12 MiB
    events, seen = run(copy=b"c" * (2 * MiB))
    assert seen == [FINAL]  # the next turn reads the client's MP4, as without a copy
    video, text, done = events
    assert isinstance(video, Segment) and video.media == FINAL
    assert isinstance(done, Complete) and done.finish_reason == "stop"
