"""GPU out-of-memory on the whole server (issue 26): each stage, capped with its
``gpu_memory_fraction`` so that it holds its weights and a 640x640 image but not a 1280x720
video, runs out of memory on purpose; the script checks that the request fails at once with the
documented 500 ``server_error`` ("the STAGE stage ran out of GPU memory ..."), that the stage's
allocated memory is back to its level before the request, that the stage is not restarted (same
pid, same restart count in ``/health``) and that the next request on it succeeds.

Two servers (hf backend, Nano-shape random-weight checkpoint, one GPU):

* direct generation (the generation stage alone at ``--generation-fraction``, 0.25): a 640x640
  image, a 1280x720 33-frame video (OOM), the image, the video (OOM), the image;
* interleaved (generation at ``--generation-fraction``, the Reasoner at
  ``--reasoner-fraction``, 0.16, on the same GPU): requests reading 1280x720 videos (30 s, then
  60 s) until the Reasoner's turn runs out of memory; a request reading a 640x640 image; a
  video request (``VIDEO_PROMPT``, sampled seeds until the Reasoner's first decision is a
  video, as serve_gpu.py probes) whose 1280x720 33-frame generation runs out
  of memory inside the interleaved pipeline (the stream's error event and ``[DONE]``); an image
  request.

With ``--calibrate`` the interleaved caps are not guessed: a first server on generous caps runs
the same (seeded) requests, the small ones first, and reads each stage's peak allocated memory
after the small requests and after the big ones; the capped server then gives each stage the
point halfway between its two peaks, so that its small requests fit and its big one does not
(the first run's guesses, 0.25 and 0.16, let a 640x640 image-conditioned generation run out of
memory while the Reasoner read a 30 s clip).

Allocated memory is each stage's own figure (``/health`` -> ``stages.<name>.gpu_memory``, from
PyTorch's allocator, sent with the stage's heartbeats), read once the request ended and two
heartbeats passed.

    python3 benchmarks/gpu_oom.py --checkpoint /tmp/nano --out benchmarks/results/wave3/gpu_oom.json
    python3 benchmarks/gpu_oom.py --checkpoint /tmp/nano --only interleaved --calibrate \
        --steps 8 --out benchmarks/results/wave3/gpu_oom_interleaved.json
    cd benchmarks && ../.venv/bin/python gpu_oom.py --placement cpu --shape micro --quick \
        --checkpoint /tmp/m

On the CPU (``--placement cpu --quick``) nothing runs out of memory: the run checks the script's
steps and records ``"oom": false``.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serve_gpu import GEN_START, VIDEO_PROMPT, child_env
from serve_kit import REPO, LogTail, Server, sse_request

if str(REPO) not in sys.path:  # the clips are made with the checkout's own media code
    sys.path.insert(0, str(REPO))

#: A stage's heartbeat is every second: two of them after a request ended carry its memory.
SETTLE_S = 2.5
OOM_TEXT = "ran out of GPU memory"
IMAGE_PROMPT = "Create an image of a red cube on a wooden table."
READ_PROMPT = "Describe what you see, then draw it again."


def gib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**30, 3)


class Run:
    """One server: its steps, with the stages' health and memory around each."""

    def __init__(self, server: Server, tail: LogTail, stages: tuple[str, ...]) -> None:
        self.server, self.tail, self.stages = server, tail, stages
        self.steps: list[dict[str, Any]] = []

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"{self.server.url}/health", timeout=10).json()

    def snapshot(self) -> dict[str, Any]:
        body = self.health()
        out: dict[str, Any] = {"status": body.get("status")}
        for stage in self.stages:
            info = body["stages"][stage]
            memory = info.get("gpu_memory") or {}
            out[stage] = {"pid": info["pid"], "restarts": info["restarts"],
                          "last_fault": info["last_fault"],
                          "allocated_gib": gib(memory.get("allocated")),
                          "reserved_gib": gib(memory.get("reserved")),
                          "peak_gib": gib(memory.get("peak"))}
        return out

    def step(self, name: str, stage: str, send: Any, expect_oom: bool) -> dict[str, Any]:
        """Run ``send()`` (its answer: status, error, seconds) between two snapshots."""
        before = self.snapshot()
        try:
            answer = send()
        except Exception as exc:  # noqa: BLE001 - recorded; the next steps still run
            answer = {"client_error": f"{type(exc).__name__}: {exc}"}
        time.sleep(SETTLE_S)
        after = self.snapshot()
        error = answer.get("error") or ""
        record = {"step": name, "stage": stage, **answer, "before": before, "after": after}
        record["oom"] = OOM_TEXT in error
        record["expected_oom"] = expect_oom
        same = all(after[s]["pid"] == before[s]["pid"]
                   and after[s]["restarts"] == before[s]["restarts"] for s in self.stages)
        record["stages_not_restarted"] = same
        record["health_ok"] = after["status"] == "ok"
        a0, a1 = before[stage]["allocated_gib"], after[stage]["allocated_gib"]
        if a0 is not None and a1 is not None:
            record["allocated_change_gib"] = round(a1 - a0, 3)
        self.steps.append(record)
        print(f"== {name}: status {answer.get('status')} oom {record['oom']} in "
              f"{answer.get('seconds')} s; {stage} allocated {a0} -> {a1} GiB; "
              f"restarted {not same}; {error[:160]}", flush=True)
        return record


# --- requests ----------------------------------------------------------------------------------
def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    import httpx

    started = time.time()
    resp = httpx.post(url, json=body, timeout=3600)
    out: dict[str, Any] = {"status": resp.status_code, "seconds": round(time.time() - started, 3)}
    if resp.status_code != 200:
        out["error"] = resp.json().get("error", {}).get("message", resp.text[:500])
        out["error_type"] = resp.json().get("error", {}).get("type")
    return out


def video_job(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A direct video job from submission to its end (completed or failed)."""
    import httpx

    started = time.time()
    job = httpx.post(f"{url}/v1/videos", json=body, timeout=60).json()
    if "id" not in job:
        return {"status": None, "error": json.dumps(job)[:500], "seconds": 0.0}
    while True:
        state = httpx.get(f"{url}/v1/videos/{job['id']}", timeout=60).json()
        if state["status"] in ("completed", "failed"):
            break
        time.sleep(0.1)
    out: dict[str, Any] = {"status": state["status"], "seconds": round(time.time() - started, 3)}
    if state.get("error"):
        out["error"] = state["error"].get("message", "")
        out["error_type"] = state["error"].get("type")
        out["error_code"] = state["error"].get("code")
    return out


def stream(url: str, body: dict[str, Any], stop_when: Any = None) -> dict[str, Any]:
    """An interleaved stream: status, its error event, whether it ended with [DONE]."""
    result = sse_request(f"{url}/generate", {**body, "stream": True}, stop_when)
    events = result["events"]
    errors = [e["error"] for e in events if e.get("event") == "error"]
    out: dict[str, Any] = {
        "status": result.get("status"), "seconds": result["wall_s"],
        "segments": [e.get("kind") for e in events if e.get("event") == "segment"],
        "done": bool(events) and events[-1].get("event") == "message"
        and "error" not in events[-1] and "kind" not in events[-1],
        "disconnected": result["disconnected_at"] is not None}
    if errors:
        out["error"] = str(errors[0])
    return out


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def png(width: int, height: int) -> bytes:
    from sglang_omni.engines.synth_media import frame_pixels
    from sglang_omni.media.encode import encode_png

    return encode_png(frame_pixels("input image", 0, width, height, 0))


def mp4(width: int, height: int, seconds: float, fps: int = 4) -> bytes:
    """A clip for the Reasoner to read (it samples 2 frames a second: 4 fps is plenty)."""
    from sglang_omni.engines.synth_media import frame_pixels
    from sglang_omni.media.encode import encode_mp4

    frames = [frame_pixels("input video", 0, width, height, i) for i in range(int(seconds * fps))]
    return encode_mp4(frames, fps)


def reading(part: dict[str, Any], options: dict[str, Any], rid: str) -> dict[str, Any]:
    """An interleaved request whose Reasoner reads ``part`` (an image or a video). Seeded, so
    that the calibration server and the capped one see the same decisions."""
    return {"rid": rid, "seed": 0, "messages": [{"role": "user", "content": [
        {"type": "text", "text": READ_PROMPT}, part]}],
        "stage_params": {"generation": options}}


# --- the two servers -----------------------------------------------------------------------------
def sizes(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        out = {"image": (64, 64), "video": (128, 128), "frames": 9, "steps": 2,
               "read_video": (128, 72), "read_seconds": (2.0,)}
    else:
        out = {"image": (640, 640), "video": (1280, 720), "frames": 33, "steps": 35,
               "read_video": (1280, 720), "read_seconds": (30.0, 60.0)}
    if args.steps:  # the peak memory of a denoising step does not depend on how many there are
        out["steps"] = args.steps
    return out


def config(path: Path, checkpoint: Path, pipeline: str, args: argparse.Namespace,
           fractions: dict[str, float]) -> None:
    import yaml

    def stage(fraction: float) -> dict[str, Any]:
        if args.placement == "cpu":
            return {"gpu": None, "factory": {"backend": "hf"}}
        return {"gpu": 0, "gpu_memory_fraction": fraction, "factory": {"backend": "hf"}}

    stages: dict[str, Any] = {"generation": stage(fractions["generation"])}
    if pipeline == "interleaved":
        stages["reasoner"] = {**stage(fractions["reasoner"]),
                              "engine": {"max_structured_tokens": 128}}
    cls = "Cosmos3UMMPipelineConfig" if pipeline == "interleaved" else "Cosmos3PipelineConfig"
    path.write_text(yaml.safe_dump({"config_cls": cls, "model_path": str(checkpoint),
                                    "stages": stages}, sort_keys=False))


def direct(run: Run, args: argparse.Namespace, plan: dict[str, Any]) -> None:
    s = sizes(args)
    url = run.server.url
    image = {"prompt": IMAGE_PROMPT, "size": "{}x{}".format(*s["image"]),
             "num_inference_steps": s["steps"]}
    video = {"prompt": "A red cube rotating on a wooden table.",
             "size": "{}x{}".format(*s["video"]), "num_frames": s["frames"],
             "num_inference_steps": s["steps"]}
    for i in range(2):
        run.step(f"direct_image_{i + 1}", "generation",
                 lambda: post_json(f"{url}/v1/images/generations", image), False)
        run.step(f"direct_video_{i + 1}", "generation", lambda: video_job(url, video), True)
    run.step("direct_image_3", "generation",
             lambda: post_json(f"{url}/v1/images/generations", image), False)


class Interleaved:
    """The interleaved server's requests: each a step of ``run``."""

    def __init__(self, run: Run, args: argparse.Namespace) -> None:
        self.run, self.s = run, sizes(args)
        self.url = run.server.url
        self.small = {"width": self.s["image"][0], "height": self.s["image"][1],
                      "num_frames": 9, "num_inference_steps": self.s["steps"]}

    def read_clip(self, seconds: float, expect_oom: bool) -> dict[str, Any]:
        clip = mp4(*self.s["read_video"], seconds)
        part = {"type": "video_url", "video_url": {"url": data_url("video/mp4", clip)}}
        record = self.run.step(f"reasoner_video_{seconds:g}s", "reasoner",
                               lambda: stream(self.url, reading(
                                   part, self.small, f"oom-read-video-{seconds:g}")), expect_oom)
        record["input_video"] = {"size": "{}x{}".format(*self.s["read_video"]),
                                 "seconds": seconds, "bytes": len(clip)}
        return record

    def read_image(self) -> dict[str, Any]:
        picture = {"type": "image_url",
                   "image_url": {"url": data_url("image/png", png(*self.s["image"]))}}
        return self.run.step("reasoner_image", "reasoner",
                             lambda: stream(self.url, reading(picture, self.small, "oom-read")),
                             False)

    def image(self) -> dict[str, Any]:
        return self.run.step("interleaved_image", "generation", lambda: stream(self.url, {
            "rid": "oom-image", "prompt": IMAGE_PROMPT, "seed": 0,
            "stage_params": {"generation": self.small}}), False)

    def video(self, seeds: range, expect_oom: bool) -> int | None:
        """Sampled seeds until the Reasoner's first decision is a video (as serve_gpu.py
        probes): that request's 1280x720 generation is the step; returns its seed."""
        big = {"width": self.s["video"][0], "height": self.s["video"][1],
               "num_frames": self.s["frames"], "num_inference_steps": self.s["steps"],
               "seed": 7}
        for seed in seeds:
            rid = f"oom-video-{seed}"
            start = self.run.tail.mark()

            def first_not_video(_events: list[dict[str, Any]], rid: str = rid,
                                start: int = start) -> bool:
                for _, _, message in self.run.tail.since(start):
                    m = GEN_START.search(message)
                    if m and m.group(1) == rid:
                        return m.group(2) != "video"
                return False

            body = {"rid": rid, "prompt": VIDEO_PROMPT, "temperature": 1.0, "seed": seed,
                    "stage_params": {"generation": big}}
            record = self.run.step(f"interleaved_video_seed_{seed}", "generation",
                                   lambda b=body, w=first_not_video: stream(self.url, b, w),
                                   expect_oom)
            if record["oom"] or "video" in record.get("segments", []):
                return seed  # the first decision was a video
            record["expected_oom"] = False  # an image first (disconnected) or no generation
            wait_quiet(self.run)
        return None


def interleaved(run: Run, args: argparse.Namespace, plan: dict[str, Any]) -> None:
    """Each stage out of memory in turn, each followed by a request that must succeed."""
    steps = Interleaved(run, args)
    for seconds in plan.get("read_seconds", steps.s["read_seconds"]):
        if steps.read_clip(seconds, True)["oom"]:
            break
    steps.read_image()
    seed = plan.get("video_seed")
    steps.video(range(seed, seed + 1) if seed is not None else range(8), True)
    steps.image()


def calibration(run: Run, args: argparse.Namespace, plan: dict[str, Any]) -> None:
    """The same requests on generous caps, the small ones first: each stage's peak allocated
    memory after the small requests and after the big ones (the PyTorch peak only grows), and the
    seed whose first decision is a video. ``plan`` gets them."""
    steps = Interleaved(run, args)
    stages = ("reasoner", "generation")
    steps.read_image()
    steps.image()
    small = {stage: run.snapshot()[stage]["peak_gib"] for stage in stages}
    seconds = max(steps.s["read_seconds"])
    steps.read_clip(seconds, False)
    big = {"reasoner": run.snapshot()["reasoner"]["peak_gib"]}
    plan["video_seed"] = steps.video(range(8), False)
    big["generation"] = run.snapshot()["generation"]["peak_gib"]
    plan.update(small_peak_gib=small, big_peak_gib=big, read_seconds=(seconds,))


def fractions_between(plan: dict[str, Any], total_gib: float | None,
                      margin_gib: float) -> dict[str, float] | None:
    """Each stage's cap halfway between its small and its big peak; None when a stage's two
    peaks are closer than ``margin_gib`` (no cap would separate them) or unknown (a CPU)."""
    small, big = plan.get("small_peak_gib") or {}, plan.get("big_peak_gib") or {}
    out: dict[str, float] = {}
    for stage in ("reasoner", "generation"):
        lo, hi = small.get(stage), big.get(stage)
        if total_gib is None or lo is None or hi is None or hi - lo < margin_gib:
            return None
        out[stage] = round((lo + hi) / 2 / total_gib, 4)
    return out


def wait_quiet(run: Run, timeout: float = 120) -> None:
    """Until no stage job is in flight (an aborted probe does not overlap the next)."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        text = httpx.get(f"{run.server.url}/metrics", timeout=5).text
        counts: dict[str, float] = {}
        for m in re.finditer(r'^sgl_omni_stage_jobs_total\{outcome="(\w+)",stage="(\w+)"\} '
                             r"(\S+)$", text, re.MULTILINE):
            sign = 1.0 if m.group(1) == "submitted" else -1.0
            counts[m.group(2)] = counts.get(m.group(2), 0.0) + sign * float(m.group(3))
        if counts and all(v <= 0 for v in counts.values()):
            return
        time.sleep(0.1)


def serve(name: str, pipeline: str, checkpoint: Path, args: argparse.Namespace, work: Path,
          fractions: dict[str, float], body: Any, plan: dict[str, Any]) -> dict[str, Any]:
    path, log = work / f"{name}.yaml", work / f"server_{name}.log"
    config(path, checkpoint, pipeline, args, fractions)
    stages = ("generation", "reasoner") if pipeline == "interleaved" else ("generation",)
    server = Server(path, log, child_env())
    tail = LogTail(log)
    out: dict[str, Any] = {"config": path.read_text(), "fractions": fractions}
    try:
        out["start_s"] = round(server.wait_ready(args.start_timeout), 2)
        time.sleep(SETTLE_S)
        run = Run(server, tail, stages)
        out["ready"] = run.snapshot()
        try:
            body(run, args, plan)
        except Exception as exc:  # noqa: BLE001 - keep the steps measured so far
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["steps"] = run.steps
    finally:
        server.stop()
        tail.stop.set()
        out["exit_code"] = server.proc.returncode
        out["oom_log_lines"] = [m for _, _, m in tail.since(0) if "out of memory" in m][:20]
    return out


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """Per expected OOM: answered with the documented error, memory back, no restart, health
    ok; and whether the request after it succeeded."""
    checks = []
    for pipeline in ("direct", "interleaved"):
        steps = results.get(pipeline, {}).get("steps", [])
        for i, step in enumerate(steps):
            if not step["oom"]:
                continue
            after = next((s for s in steps[i + 1:] if s["stage"] == step["stage"]
                          and not s["expected_oom"]), None)
            change = step.get("allocated_change_gib")
            checks.append({
                "step": step["step"], "stage": step["stage"], "seconds": step.get("seconds"),
                "type_server_error": step.get("error_type", "server_error") == "server_error",
                "allocated_change_gib": change,
                "memory_back": change is not None and abs(change) < 0.05,
                "not_restarted": step["stages_not_restarted"], "health_ok": step["health_ok"],
                "next_ok": after is not None and after.get("status") in (200, "completed")
                and not after.get("error")})
    expected = sum(1 for p in ("direct", "interleaved")
                   for s in results.get(p, {}).get("steps", []) if s["expected_oom"])
    return {"ooms": len(checks), "expected": expected, "checks": checks,
            "all_ok": bool(checks) and all(all(v for k, v in c.items() if isinstance(v, bool))
                                           for c in checks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="built here when missing")
    parser.add_argument("--shape", default="nano", choices=["nano", "micro", "tiny"])
    parser.add_argument("--placement", choices=["one-gpu", "cpu"], default="one-gpu")
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps")
    parser.add_argument("--generation-fraction", type=float, default=0.25)
    parser.add_argument("--reasoner-fraction", type=float, default=0.16)
    parser.add_argument("--only", default="direct,interleaved")
    parser.add_argument("--out", help="write the JSON figures here")
    parser.add_argument("--logs", help="keep the servers' logs in this folder")
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--steps", type=int, help="denoising steps (default 35; 2 with --quick)")
    parser.add_argument("--calibrate", action="store_true",
                        help="interleaved: set each stage's cap halfway between the peaks its "
                             "small and big requests reach on a first, generous server")
    parser.add_argument("--margin-gib", type=float, default=0.5,
                        help="--calibrate: the least gap between the two peaks")
    args = parser.parse_args()
    checkpoint = Path(args.checkpoint)
    results: dict[str, Any] = {"shape": args.shape, "placement": args.placement,
                               "quick": args.quick,
                               "generation_fraction": args.generation_fraction,
                               "reasoner_fraction": args.reasoner_fraction}
    if not (checkpoint / "model_index.json").is_file():
        started = time.time()
        subprocess.run([sys.executable, "-m", "sglang_omni", "make-checkpoint", "--shape",
                        args.shape, str(checkpoint)], cwd=str(REPO), env=child_env(),
                       check=True, capture_output=True)
        results["checkpoint_build_s"] = round(time.time() - started, 1)
    try:
        import torch

        results["torch"] = torch.__version__
        if torch.cuda.is_available():
            results["gpu"] = torch.cuda.get_device_name(0)
            results["gpu_total_gib"] = gib(torch.cuda.get_device_properties(0).total_memory)
    except ImportError:
        pass
    work = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="gpu-oom-"))
    work.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each server: a run cut short keeps what it measured
        results["verdict"] = verdict(results)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    fractions = {"generation": args.generation_fraction, "reasoner": args.reasoner_fraction}
    plan: dict[str, Any] = {}
    if args.calibrate and "interleaved" in args.only.split(","):
        generous = {"generation": 0.55, "reasoner": 0.3}
        results["calibration"] = serve("calibration", "interleaved", checkpoint, args, work,
                                       generous, calibration, plan)
        results["calibration"]["plan"] = dict(plan)
        found = fractions_between(plan, results.get("gpu_total_gib"), args.margin_gib)
        print(f"== calibration: {plan}; caps {found}", flush=True)
        save()
        if found is None and args.placement != "cpu":
            print("the calibration found no cap between the small and the big requests' peaks",
                  file=sys.stderr)
            return 1
        fractions = found or fractions
        results.update(generation_fraction=fractions["generation"],
                       reasoner_fraction=fractions["reasoner"])
    bodies = {"direct": direct, "interleaved": interleaved}
    for pipeline in args.only.split(","):
        results[pipeline] = serve(pipeline, pipeline, checkpoint, args, work, fractions,
                                  bodies[pipeline], plan)
        save()
    print(json.dumps(results["verdict"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
