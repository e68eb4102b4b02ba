"""The server fixes glibc's mmap threshold for itself and its stage processes, so the memory of
large short-lived buffers (inline media) goes back to the system instead of staying with the
process (``benchmarks/memory_creep.py`` measures the effect: +312 MiB over 25 streamed
worst-case requests before, +0 after)."""

from __future__ import annotations

import psutil

from sglang_omni.runtime.allocator import ENV, MMAP_THRESHOLD
from tests.server import SCRIPTED_CHAT, Server


def test_stage_processes_start_with_a_fixed_mmap_threshold() -> None:
    with Server(*SCRIPTED_CHAT, env={ENV: ""}) as server:
        stages = psutil.Process(server.proc.pid).children(recursive=True)
        assert stages
        for stage in stages:
            assert stage.environ().get(ENV) == str(MMAP_THRESHOLD), stage.cmdline()


def test_an_operators_own_threshold_is_kept() -> None:
    with Server(*SCRIPTED_CHAT, env={ENV: "262144"}) as server:
        for stage in psutil.Process(server.proc.pid).children(recursive=True):
            assert stage.environ().get(ENV) == "262144"
