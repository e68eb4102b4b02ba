"""Helpers for the direct generation tests: servers, metrics, waiting, video jobs."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from tests.kit import wait_for as wait_for  # shared; re-exported for the generation tests
from tests.server import SCRIPTED_GENERATION, Server

HTTP = httpx.Client(timeout=60)
JOBS_RE = re.compile(r'^sgl_omni_stage_jobs_total\{outcome="(\w+)",stage="(\w+)"\} (\S+)$')
FAKE_DRIVER = "tests.generation.fake_diffusion:FakeDiffusion"


def metric(server: Server, outcome: str, stage: str = "generation") -> float:
    for line in HTTP.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        match = JOBS_RE.match(line)
        if match and match[1] == outcome and match[2] == stage:
            return float(match[3])
    raise AssertionError(f"no {stage}/{outcome} job counter in /metrics")


def png_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        return img.size


def error_of(resp: httpx.Response) -> dict[str, Any]:
    return resp.json()["error"]


def wait_video(server: Server, video_id: str, timeout: float = 30) -> dict[str, Any]:
    """The job once its status is completed or failed."""
    job: dict[str, Any] = {}

    def done() -> bool:
        job.update(HTTP.get(f"{server.url}/v1/videos/{video_id}").json())
        return job["status"] in ("completed", "failed")

    wait_for(done, timeout)
    return job


def scripted_server(*flags: str, **kwargs: Any) -> Server:
    return Server(*SCRIPTED_GENERATION, *flags, **kwargs)


def native_server(log_dir: Path, output_dir: Path, *flags: str, env: dict[str, str] | None = None,
                  wait_ready: bool = True) -> Server:
    """A direct generation server whose stage runs the native engine over the fake driver."""
    return Server(*SCRIPTED_GENERATION, "--generation.gpu", "0",
                  "--generation.factory.backend", "native",
                  "--generation.factory.output_dir", str(output_dir),
                  "--model-path", "/models/cosmos3-nano", *flags,
                  env={"CUDA_VISIBLE_DEVICES": "0", "SGLANG_OMNI_DIFFUSION_DRIVER": FAKE_DRIVER,
                       "FAKE_DIFFUSION_LOG": str(log_dir), "SGLANG_PLUGINS": "",
                       **(env or {})},
                  wait_ready=wait_ready)
