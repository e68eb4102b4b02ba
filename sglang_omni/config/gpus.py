"""How many GPUs this process can see, without importing torch."""

from __future__ import annotations

import os
import shutil
import subprocess


def visible_gpu_count() -> int:
    """Visible GPUs: the entries of ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def device_env(visible_index: int | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value a stage placed on ``visible_index`` gets.

    Index i of the server's visible GPUs maps to the i-th entry of its own
    ``CUDA_VISIBLE_DEVICES`` (or to physical GPU i when the variable is unset); None is the CPU.
    """
    if visible_index is None:
        return ""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return str(visible_index)
    entries = [d.strip() for d in env.split(",") if d.strip()]
    return entries[visible_index]
