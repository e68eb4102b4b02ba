"""Omni's orchestration overhead on interleaved requests, with zero-delay scripted engines.

Usage: python benchmarks/umm_overhead.py [--requests 30]

Runs the real controller, Cosmos3 adapter and scripted stage processes in this process's event
loop. Each dispatch's overhead is the time the controller spent before it since the previous
dispatch ended (adapter, segments, limits) plus its round trip minus the time the engine itself
reported: the cost of Omni, not of the (scripted) model.

1. Per-dispatch overhead (p50, p99) over small two-generation requests.
2. The spec's worst case: eight 8 MiB videos and the nine Reasoner turns around them; every
   Reasoner turn reads all videos generated so far, and each crosses to the Reasoner stage once
   (8 x 8 MiB relayed, as the server relays them: ``pipeline.reasoner_media``; the reference
   relays 36 x 8 MiB, the spec's "about 402.7 MB" counting them base64-encoded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from sglang_omni.config import load_config, parse_overrides
from sglang_omni.contract.result import StageResult
from sglang_omni.media import MediaPolicy
from sglang_omni.models.cosmos3 import Cosmos3UMMAdapter
from sglang_omni.pipeline.reasoner_media import ReasonerMedia
from sglang_omni.pipeline.stages import StageSet
from sglang_omni.pipeline.umm import Limits, UMMController, UMMRequest

CONFIG = Path(__file__).parents[1] / "configs" / "cpu-scripted.yaml"
MiB = 1024 * 1024


class Recorder:
    def __init__(self, stages: StageSet) -> None:
        self.stages = stages
        self.samples: list[float] = []
        self.to_reasoner = 0
        self.last_end = 0.0
        self.media: dict[str, ReasonerMedia] = {}

    def begin(self) -> None:
        self.last_end = time.perf_counter()

    async def call(self, stage: str, rid: str, payload: dict[str, Any],
                   frames: list) -> StageResult:
        start = time.perf_counter()
        handle = self.stages[stage]
        if stage == "reasoner":  # as the orchestrator sends it: each item once per request
            media = self.media.setdefault(rid, ReasonerMedia(rid, MediaPolicy()))
            turn = await media.prepare(handle, payload, frames)
            result = await handle.call(rid, turn.payload, turn.frames, media=turn.media)
            media.sent(handle, turn)
            self.to_reasoner += sum(len(f) for f in turn.frames)
        else:
            result = await handle.call(rid, payload, frames)
        end = time.perf_counter()
        self.samples.append((start - self.last_end) + (end - start - result.engine_s))
        self.last_end = end
        return result

    def end(self, rid: str) -> None:
        """The request ended: the Reasoner stage drops its media."""
        media = self.media.pop(rid, None)
        if media is not None:
            media.close()
        self.stages["reasoner"].end_request(rid)


def script(*entries: dict[str, Any]) -> str:
    return f"<omni-script>{json.dumps(list(entries))}</omni-script>"


async def run_request(controller: UMMController, recorder: Recorder, rid: str, text: str,
                      options: dict[str, Any]) -> float:
    request = UMMRequest(rid=rid, messages=[{"role": "user", "content": text}],
                         stage_params={"generation": options})
    recorder.begin()
    start = time.perf_counter()
    async for _ in controller.open(request).events():
        pass
    recorder.end(rid)
    return time.perf_counter() - start


async def main(requests: int) -> None:
    config = load_config(CONFIG, parse_overrides([]), visible_gpus=0)
    stages = StageSet(config, "warning")
    await stages.start()
    try:
        recorder = Recorder(stages)
        controller = UMMController(Cosmos3UMMAdapter, Limits(), recorder.call)
        small = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 1}
        two = script({"action": "image", "prompt": "a"}, {"action": "video", "prompt": "b"},
                     {"action": "final", "text": "done"})
        await run_request(controller, recorder, "warm", two, small)
        recorder.samples.clear()
        cpu = time.process_time()
        for i in range(requests):
            await run_request(controller, recorder, f"small-{i}", two, small)
        cpu = (time.process_time() - cpu) / requests
        samples = sorted(recorder.samples)
        p50 = statistics.median(samples)
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        print(f"per-dispatch overhead over {len(samples)} dispatches ({requests} requests of "
              f"5 dispatches): p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms; server CPU "
              f"{cpu * 1e3:.2f} ms per request (this process: controller, adapter, stage IPC)")

        recorder.samples.clear()
        recorder.to_reasoner = 0
        videos = [{"action": "video", "prompt": f"!size={8 * MiB} clip {i}"} for i in range(8)]
        worst = script(*videos, {"action": "final", "text": "compared"})
        wall = await run_request(controller, recorder, "worst", worst, small)
        overhead = sum(recorder.samples)
        print(f"worst case (8 videos of 8 MiB, 9 Reasoner turns, {len(recorder.samples)} "
              f"dispatches): relayed to the Reasoner {recorder.to_reasoner / 1e6:.1f} MB raw "
              f"({recorder.to_reasoner * 4 / 3 / 1e6:.1f} MB as base64); "
              f"Omni overhead {overhead:.3f} s of {wall:.3f} s wall")
    finally:
        await stages.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=30)
    asyncio.run(main(parser.parse_args().requests))
