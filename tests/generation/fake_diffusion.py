"""A fake native diffusion driver: the native generation engine's tests run over it, no sglang.

Selected with ``SGLANG_OMNI_DIFFUSION_DRIVER=tests.generation.fake_diffusion:FakeDiffusion``.
Like ``DiffGenerator`` in local mode it spawns one worker process (``multiprocessing`` spawn,
named ``sglang-diffusionWorker-0``), so the worker takes the stage's ``sys.path``; the worker
looks the ``omni_generation_cancellation`` entry point up as the real plugin loader does and,
when it finds it, runs the real plugin hook functions around its simulated denoising steps.

Environment (set by the tests): ``FAKE_DIFFUSION_LOG`` a folder receiving ``worker.pid``,
``server_kwargs.json``, ``requests.jsonl`` (every generation's native kwargs) and
``finished-<request id>`` once a generation ran all its steps;
``FAKE_STEP_S`` seconds per step (0.05); ``FAKE_NATIVE_ABORT=1`` gives the driver a native
abort method; ``FAKE_FFMPEG`` the FFmpeg to report. Prompt directives: ``!no-media`` (native
ends without media, as on a guardrail block), ``!refuse`` (native refuses the parameters),
``!bad-file`` (native writes a file that is not the media it claims), ``!oom`` (native's worker
runs out of GPU memory and ends the request without media, as native reports it),
``!slow-write=S`` (after its last step, native writes its MP4 a piece at a time over S
seconds, as its encoder does: no step is reported meanwhile).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_omni.engines.native import cancellation_plugin as plugin
from sglang_omni.engines.native.generation_driver import NativeFailed, NativeOutput
from sglang_omni.engines.synth_media import encode_mp4, encode_png, frame_pixels
from sglang_omni.errors import NativeRefusal


def _log_dir() -> Path:
    return Path(os.environ["FAKE_DIFFUSION_LOG"])


def _plugin_found() -> bool:
    names = {ep.name for ep in entry_points(group=plugin.ENTRY_POINT_GROUP)}
    return plugin.PLUGIN_NAME in names


def _denoise(folder: str, steps: int, step_s: float) -> None:
    def loop(_stage: Any, _batch: Any) -> None:
        for i in range(steps):
            if hooked:
                plugin.before_denoising_step(None, step_index=i, num_steps=steps)
            time.sleep(step_s)

    hooked = _plugin_found()
    batch = SimpleNamespace(output_path=folder)
    if hooked:
        plugin.around_denoise_loop(loop, None, batch)
    else:
        loop(None, batch)


def _generate(kwargs: dict[str, Any], step_s: float) -> tuple[str, Any]:
    prompt = kwargs["prompt"]
    if prompt.startswith("!refuse"):
        return "refused", "width must be a multiple of 16"
    try:
        _denoise(kwargs["output_path"], int(kwargs.get("num_inference_steps", 4)), step_s)
    except plugin.GenerationCancelled as exc:
        return "error", str(exc)
    (_log_dir() / f"finished-{kwargs['request_id']}").touch()
    if prompt.startswith("!no-media"):
        return "error", "Guardrail blocked prompt."
    if prompt.startswith("!oom"):
        return "error", "CUDA out of memory. Tried to allocate 9.00 GiB (fake native worker)"
    width, height = int(kwargs.get("width", 64)), int(kwargs.get("height", 64))
    frames = int(kwargs.get("num_frames", 9))
    if frames == 1:
        path = Path(kwargs["output_path"]) / f"{kwargs['output_file_name']}.png"
        data = encode_png(frame_pixels(prompt, int(kwargs.get("seed", 0)), width, height, 0))
    else:
        path = Path(kwargs["output_path"]) / f"{kwargs['output_file_name']}.mp4"
        data = encode_mp4([frame_pixels(prompt, int(kwargs.get("seed", 0)), width, height, i)
                           for i in range(frames)], int(kwargs.get("fps", 24)))
    slow = re.match(r"!slow-write=([0-9.]+)", prompt)
    if slow:
        _write_slowly(path, data, float(slow.group(1)))
        return "ok", str(path)
    path.write_bytes(b"not media at all" if prompt.startswith("!bad-file") else data)
    return "ok", str(path)


def _write_slowly(path: Path, data: bytes, seconds: float, pieces: int = 40) -> None:
    """``data`` to ``path`` in ``pieces`` parts spread over ``seconds`` (an encoder's output)."""
    size = max(1, -(-len(data) // pieces))
    with path.open("wb") as out:
        for start in range(0, len(data), size):
            out.write(data[start:start + size])
            out.flush()
            time.sleep(seconds / pieces)


def _action(request: dict[str, Any], folder: str, step_s: float) -> tuple[str, Any]:
    params = request.get("parameters") or {}
    if "domain_name" not in params and "domain_id" not in params:
        return "refused", "Cosmos3 action requests require domain_name or domain_id"
    if params.get("domain_name") not in (None, "droid_lerobot"):  # native's embodiment table
        return "refused", f"unknown embodiment {params['domain_name']!r}"
    try:
        _denoise(folder, int(params.get("num_inference_steps", 4)), step_s)
    except plugin.GenerationCancelled as exc:
        return "error", str(exc)
    dim = int(params.get("raw_action_dim", 10))
    values = [[0.5] * dim for _ in range(16)]
    return "ok", {"object": "action.generation", "model": "fake", "data": [
        {"index": 0, "action": {"shape": [16, dim], "values": values}}],
        "image": (request.get("input") or {}).get("image")}


def worker_main(conn: Any) -> None:
    """The fake worker: reports the plugin like the real one, then serves requests."""
    if _plugin_found():
        plugin.report_registered()
    (_log_dir() / "worker.pid").write_text(str(os.getpid()))
    conn.send("ready")
    step_s = float(os.environ.get("FAKE_STEP_S", "0.05"))
    while True:
        op, arg = conn.recv()
        if op == "stop":
            return
        if op == "generate":
            conn.send(_generate(arg, step_s))
        else:
            conn.send(_action(arg[0], arg[1], step_s))


class FakeDiffusion:
    """Implements ``generation_driver.DiffusionDriver`` over the fake worker."""

    def __init__(self) -> None:
        self.process: Any = None
        self.conn: Any = None

    def native_abort(self) -> str | None:
        return "abort_request" if os.environ.get("FAKE_NATIVE_ABORT") == "1" else None

    def register_own_plugins(self) -> None:
        (_log_dir() / "stage_saw_plugin").write_text(str(_plugin_found()))

    def start(self, server_kwargs: dict[str, Any]) -> None:
        (_log_dir() / "server_kwargs.json").write_text(json.dumps(server_kwargs))
        ctx = mp.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(theirs,),
                                   name="sglang-diffusionWorker-0", daemon=True)
        self.process.start()
        theirs.close()
        assert self.conn.recv() == "ready"  # native waits for every worker's ready message

    def workers(self) -> list[Any]:
        return [self.process]

    def ffmpeg(self) -> str:
        return os.environ.get("FAKE_FFMPEG", "ffmpeg")

    def _ask(self, op: str, arg: Any) -> tuple[str, Any]:
        try:
            self.conn.send((op, arg))
            return self.conn.recv()
        except (EOFError, OSError):
            return "error", "the scheduler connection closed"

    def generate(self, kwargs: dict[str, Any]) -> NativeOutput:
        with open(_log_dir() / "requests.jsonl", "a") as f:
            f.write(json.dumps(kwargs) + "\n")
        status, value = self._ask("generate", kwargs)
        if status == "refused":
            raise NativeRefusal(value)
        if status == "error":
            return NativeOutput(None, f"Generation failed: {value}")
        return NativeOutput(value)

    def generate_action(self, request: dict[str, Any], folder: str) -> dict[str, Any]:
        status, value = self._ask("action", (request, folder))
        if status == "refused":
            raise NativeRefusal(value)
        if status == "error":
            raise NativeFailed(value)
        return value

    def abort(self, request_id: str) -> None:
        with open(_log_dir() / "native_aborts", "a") as f:
            f.write(request_id + "\n")

    def release(self) -> None:
        self.conn.close()

    def shutdown(self) -> None:
        if self.process is not None and self.process.is_alive():
            try:
                self.conn.send(("stop", None))
            except OSError:
                pass
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
