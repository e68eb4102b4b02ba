"""The hf engines at Cosmos3 Nano's size on one GPU: fast paths against stock, in one run.

Loads a checkpoint built by ``sgl-omni make-checkpoint --shape nano`` (random weights in the real
layout) into the hf engines (``HFReasoner``, ``HFGenerator``: the code the stage processes run)
and times, each side by side in the same process:

* Reasoner decoding on a 722-token prompt: transformers' eager ``generate`` against the static
  KV cache replayed as CUDA graphs (``engines/hf/static_decode.py``), for a decision under the
  decision JSON schema (greedy, at most 128 tokens) and 256 plain tokens; whether the greedy
  text is the same; tokens per second of the whole turn and of decoding alone;
* generation: stock ``Cosmos3OmniPipeline.__call__`` against ``engines/hf/denoise.py`` for a
  640x640 image (per denoising step, CFG on) and a 33-frame 1280x720 text-to-video request with
  35 steps (end to end), and how far their outputs differ for the same seed;
* how many denoising steps run after an abort on the fast path.

    python benchmarks/hf_gpu.py --checkpoint /tmp/nano --out benchmarks/results/hf_gpu_nano.json
    python benchmarks/hf_gpu.py --tiny     # the micro shape on the CPU, to check the script
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglang_omni.contract.job import EngineSpec, Job  # noqa: E402
from sglang_omni.engines.hf import HFGenerator, HFReasoner  # noqa: E402
from sglang_omni.engines.hf.common import JobCancelled  # noqa: E402
from sglang_omni.models.cosmos3 import decision  # noqa: E402
from sglang_omni.models.cosmos3.nano_checkpoint import build_checkpoint  # noqa: E402

PROMPT_TOKENS = 722
WORDS = ("a red cube on a wooden table under soft light next to a blue sphere and a green "
         "cone ").split()


def spec(role: str, root: Path, gpu: int | None, **engine: Any) -> EngineSpec:
    return EngineSpec(stage=role, role=role, backend="hf", model_path=str(root), gpu=gpu,
                      gpu_memory_fraction=None, factory={}, engine=engine)


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- the Reasoner ------------------------------------------------------------------------------
def long_prompt(engine: HFReasoner, tokens: int) -> str:
    """A user message whose rendered prompt is ``tokens`` tokens long (or just over)."""
    words: list[str] = []
    while True:
        words.extend(WORDS)
        text = " ".join(words)
        rendered = engine.processor.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        if len(engine.tokenizer(rendered)["input_ids"]) >= tokens:
            return text


def turn(engine: HFReasoner, loop: asyncio.AbstractEventLoop,
         payload: dict[str, Any]) -> dict[str, Any]:
    sync()
    started = time.perf_counter()
    result = loop.run_until_complete(engine.run(Job("bench", payload, [], emit=lambda _: None)))
    sync()
    seconds = time.perf_counter() - started
    usage = result.payload["usage"]
    return {"prompt_tokens": usage["prompt_tokens"], "tokens": usage["completion_tokens"],
            "seconds": round(seconds, 4), "text": result.payload["text"]}


def time_reasoner(engine: HFReasoner, plain_tokens: int, repeats: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    messages = [{"role": "user", "content": long_prompt(engine, PROMPT_TOKENS)}]
    payloads = {
        "decision": {"messages": messages, "sampling": {"temperature": 0.0},
                     "response_format": decision.response_format(("image", "video"))},
        "plain": {"messages": messages, "sampling": {"max_tokens": plain_tokens,
                                                     "min_tokens": plain_tokens}},
        "one": {"messages": messages, "sampling": {"max_tokens": 1}},
    }
    fast_decoder = engine.decoder
    out: dict[str, Any] = {}
    for mode, decoder in (("eager_generate", None), ("static_graphs", fast_decoder)):
        engine.decoder = decoder
        turn(engine, loop, payloads["one"])  # warm: this path's kernels and a graph
        runs = {name: [turn(engine, loop, payloads[name]) for _ in range(
            1 if decoder is None else repeats)] for name in ("one", "decision", "plain")}
        first = runs["one"][0]["seconds"]
        figures: dict[str, Any] = {}
        for name in ("decision", "plain"):
            best = min(runs[name], key=lambda r: r["seconds"])
            n = best["tokens"]
            figures[name] = {
                "prompt_tokens": best["prompt_tokens"], "tokens": n,
                "turn_s": best["seconds"], "tokens_per_s": round(n / best["seconds"], 1),
                "decode_tokens_per_s": round((n - 1) / max(best["seconds"] - first, 1e-9), 1),
                "text": best["text"]}
        figures["prefill_and_first_token_s"] = first
        out[mode] = figures
    engine.decoder = fast_decoder
    loop.close()
    for name in ("decision", "plain"):
        eager, fast = out["eager_generate"][name], out["static_graphs"][name]
        same = 0
        while same < min(len(eager["text"]), len(fast["text"])) and \
                eager["text"][same] == fast["text"][same]:
            same += 1
        out[f"{name}_speedup"] = round(fast["tokens_per_s"] / eager["tokens_per_s"], 2)
        out[f"{name}_same_text"] = eager["text"] == fast["text"]
        out[f"{name}_common_prefix_chars"] = same
        out[f"{name}_valid_decision"] = _valid(fast["text"]) if name == "decision" else None
    for mode in ("eager_generate", "static_graphs"):
        for name in ("decision", "plain"):
            out[mode][name]["text"] = out[mode][name]["text"][:200]
    return out


def _valid(text: str) -> bool:
    try:
        decision.parse(text)
        return True
    except Exception:  # noqa: BLE001
        return False


# --- generation --------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.marks: list[float] = []

    def emit(self, chunk: dict) -> None:
        if "step" in chunk:
            self.marks.append(time.perf_counter())


def generate(engine: HFGenerator, fast: bool, modality: str, width: int, height: int,
             frames: int, steps: int) -> tuple[dict[str, Any], Any]:
    engine.fast = fast
    call = engine._plan(modality, "a red cube on a wooden table, soft light", {
        "width": width, "height": height, "num_frames": frames, "num_inference_steps": steps,
        "seed": 7})
    clock = Clock()
    sync()
    started = time.perf_counter()
    outcome = engine._denoise(Job(f"{modality}-{width}", {}, [], emit=clock.emit), call)
    sync()
    ended = time.perf_counter()
    gaps = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    return ({"loop": "fast" if fast else "stock", "size": f"{width}x{height}", "frames": frames,
             "steps": steps, "first_step_s": round(clock.marks[0] - started, 4),
             "step_s_median": round(statistics.median(gaps), 4) if gaps else None,
             "decode_s": round(ended - clock.marks[-1], 3), "total_s": round(ended - started, 3)},
            outcome[0])


def difference(a: Any, b: Any) -> dict[str, float]:
    import numpy as np

    x = (np.clip(np.asarray(a), 0, 1) * 255).round()
    y = (np.clip(np.asarray(b), 0, 1) * 255).round()
    d = np.abs(x - y)
    return {"mean_abs_8bit": round(float(d.mean()), 3), "max_abs_8bit": float(d.max()),
            "share_of_pixels_off_by_more_than_2": round(float((d > 2).mean()), 5)}


def time_generation(engine: HFGenerator, image: tuple[int, int, int],
                    video: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    w, h, steps = image
    results = {}
    for fast in (False, True):
        generate(engine, fast, "image", w, h, 1, 2)  # warm this path at this size
        results[fast] = generate(engine, fast, "image", w, h, 1, steps)
    stock, fast_ = results[False][0], results[True][0]
    out["image"] = {"stock": stock, "fast": fast_,
                    "step_speedup": round(stock["step_s_median"] / fast_["step_s_median"], 2),
                    "output_difference": difference(results[False][1], results[True][1])}
    vw, vh, frames, vsteps = video
    results = {}
    for fast in (False, True):
        generate(engine, fast, "video", vw, vh, frames, 2)  # warm: kernels, VAE at this size
        results[fast] = generate(engine, fast, "video", vw, vh, frames, vsteps)
    stock, fast_ = results[False][0], results[True][0]
    out["video"] = {"stock": stock, "fast": fast_,
                    "saved_s": round(stock["total_s"] - fast_["total_s"], 3),
                    "step_speedup": round(stock["step_s_median"] / fast_["step_s_median"], 2),
                    "output_difference": difference(results[False][1], results[True][1])}
    out["cancel_fast_image"] = time_cancel(engine, w, h, out["image"]["fast"]["step_s_median"],
                                           3)
    return out


def time_cancel(engine: HFGenerator, width: int, height: int, step_s: float,
                trials: int) -> dict[str, Any]:
    """Abort at a random point of step 4 of 50 from another thread (fast path): passes of
    steps that start after the abort, and the abort-to-return time."""
    import random

    rng = random.Random(0)
    engine.fast = True
    after, latency = [], []
    for trial in range(trials):
        call = engine._plan("image", "a cube", {"width": width, "height": height,
                                                "num_inference_steps": 50, "seed": trial})
        marks: list[int] = []
        state: dict[str, float] = {}
        job = Job("cancel", {}, [], emit=marks.append)

        def cancel_later(job: Job = job, state: dict = state, marks: list = marks) -> None:
            while len(marks) < 3:
                time.sleep(0.0005)
            time.sleep(rng.uniform(0.05, 0.95) * step_s)
            state["at"] = time.perf_counter()
            state["steps_at"] = len(marks)
            job.cancelled.set()

        threading.Thread(target=cancel_later, daemon=True).start()
        try:
            engine._denoise(job, call)
            raise RuntimeError("the generation was not cancelled")
        except JobCancelled:
            pass
        sync()
        latency.append(time.perf_counter() - state["at"])
        after.append(len(marks) - int(state["steps_at"]))
    return {"trials": trials, "steps_ended_after_abort": after,
            "abort_to_return_s_max": round(max(latency), 4)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", help="a make-checkpoint folder (default: build one)")
    parser.add_argument("--tiny", action="store_true", help="the micro shape on the CPU")
    parser.add_argument("--image-steps", type=int, default=12)
    parser.add_argument("--out", help="write the JSON figures here too")
    args = parser.parse_args()
    import torch

    gpu = None if args.tiny or not torch.cuda.is_available() else 0
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if gpu == 0 else "cpu",
                               "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.checkpoint) if args.checkpoint else build_checkpoint(
            Path(scratch) / "ckpt", shape="micro" if args.tiny else "nano")
        started = time.perf_counter()
        reasoner = HFReasoner(spec("reasoner", root, gpu, max_structured_tokens=128,
                                   decoder="graphs" if gpu == 0 else "static"))
        reasoner._load()
        figures["reasoner_load_and_warmup_s"] = round(time.perf_counter() - started, 1)
        figures["reasoner"] = time_reasoner(reasoner, 32 if args.tiny else 256,
                                            1 if args.tiny else 2)
        started = time.perf_counter()
        generator = HFGenerator(spec("generation", root, gpu))
        generator._load()
        figures["generator_load_and_warmup_s"] = round(time.perf_counter() - started, 1)
        image = (64, 64, 3) if args.tiny else (640, 640, args.image_steps)
        video = (128, 96, 9, 3) if args.tiny else (1280, 720, 33, 35)
        figures["generation"] = time_generation(generator, image, video)
        if gpu == 0:
            figures["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
