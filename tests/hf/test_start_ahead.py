"""An hf engine's start: while its model thread imports and loads, the checkpoint's weight files
are read ahead and, on a GPU, CUDA initialises; the start ends after both."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from sglang_omni.contract.job import EngineSpec
from sglang_omni.engines.hf import common
from sglang_omni.engines.hf.common import ModelThread, ThreadedModelEngine, prefetch_weights


def checkpoint(root: Path) -> list[Path]:
    """A checkpoint's layout: weights at the top and in component folders, beside configs."""
    weights = [root / "model.safetensors", root / "transformer" / "a.safetensors",
               root / "vae" / "deep" / "b.safetensors"]
    for path in [*weights, root / "config.json", root / "vae" / "config.json"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 64)
    return weights


def advised(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the path of each file posix_fadvise is asked about."""
    paths: list[str] = []

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        assert (offset, length, advice) == (0, 0, os.POSIX_FADV_WILLNEED)
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    return paths


def test_every_weight_file_is_read_ahead_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = checkpoint(tmp_path)
    paths = advised(monkeypatch)
    assert prefetch_weights(str(tmp_path)) == 3
    assert sorted(paths) == sorted(str(p) for p in weights)
    assert prefetch_weights(str(tmp_path / "missing")) == 0


class Loader(ThreadedModelEngine):
    """Loads nothing: records what had happened ahead of it when its load ran."""

    def __init__(self, spec: EngineSpec, seen: list[str]) -> None:
        self.spec = spec
        self.thread = ModelThread(spec)
        self.seen = seen
        self.at_load: list[str] = []

    def _load(self) -> None:
        for _ in range(500):  # the read-ahead runs beside the load; wait for it here
            if len(self.seen) == 3:
                break
            threading.Event().wait(0.01)
        self.at_load = list(self.seen)


@pytest.mark.parametrize("gpu", [None, 0])
def test_the_start_reads_ahead_beside_the_load_and_inits_cuda_only_for_a_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: int | None) -> None:
    checkpoint(tmp_path)
    paths = advised(monkeypatch)
    inits: list[str] = []
    monkeypatch.setattr(common, "init_cuda", lambda: inits.append(
        threading.current_thread().name))
    spec = EngineSpec("reasoner", "reasoner", "hf", str(tmp_path), gpu, None, {}, {})
    engine = Loader(spec, paths)
    asyncio.run(engine.start())
    asyncio.run(engine.close())
    assert len(engine.at_load) == 3  # read ahead while the load ran, not after it
    assert inits == ([] if gpu is None else ["cuda-init"])
    assert not [t for t in threading.enumerate() if t.name in ("weights-prefetch", "cuda-init")]
