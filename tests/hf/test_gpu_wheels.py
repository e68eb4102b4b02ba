"""The GPU recipe's wheel list (``benchmarks/gpu_wheels.py``) is derived from ``pyproject.toml``
and covers every package a real hf-backend server imports, its stage processes included, from
start through one interleaved request (the recipe once crashed at start-up on a missing
``websockets`` that a hand-written list had left out)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.server import Server

ROOT = Path(__file__).resolve().parents[2]
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.M)


def gpu_wheels() -> ModuleType:
    path = ROOT / "benchmarks" / "gpu_wheels.py"
    spec = importlib.util.spec_from_file_location("gpu_wheels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_wheels"] = module
    spec.loader.exec_module(module)
    return module


#: Imported by the packages we declare only when installed (each inside a try or behind an
#: availability check), so the GPU host runs without them; present here through other extras.
OPTIONAL_WHEN_INSTALLED = {
    "uvloop": "uvicorn's loop='auto'",
    "watchfiles": "uvicorn's reloader",
    "sniffio": "the HTTP clients' async library detection",
    "google": "transformers' protobuf availability check",
    "colorama": "tqdm's terminal colours",
}


def distributions_of(top_level_modules: set[str]) -> dict[str, set[str]]:
    """Top-level module -> the distributions installed here that ship it. Left out: the stdlib,
    our own package, and names an import tried and did not find (``-X importtime`` lists
    failed optional imports too)."""
    shipped = md.packages_distributions()
    found: dict[str, set[str]] = {}
    for name in top_level_modules:
        if name in sys.stdlib_module_names or name.startswith("__editable__") \
                or name in ("sglang_omni", "sitecustomize") or name in OPTIONAL_WHEN_INSTALLED:
            continue
        dists = {d.lower().replace("_", "-") for d in shipped.get(name, [])}
        if dists:
            found[name] = dists
    return found


def test_the_wheel_list_follows_pyproject() -> None:
    wheels = gpu_wheels()
    needed = wheels.closure(wheels.declared(["hf"]))
    assert {"fastapi", "websockets", "transformers", "av"} <= set(needed)
    carry = {e.name for e in wheels.to_carry(needed, {"fastapi": "0.1"})}
    assert "fastapi" in carry  # the host's version is refused by fastapi>=0.110
    assert "torch" not in carry  # the GPU image's CUDA build is used
    assert "websockets" in carry
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        wheels.declared(["nope"])


@pytest.mark.timeout(300)
def test_every_package_a_running_server_imports_is_carried_or_on_the_host(
        tiny_checkpoint: Path) -> None:
    wheels = gpu_wheels()
    needed = set(wheels.closure(wheels.declared(["hf"])))
    with Server("--demo", "--model-path", str(tiny_checkpoint),
                "--orchestrator.factory.max_dispatches", "3",
                env={"PYTHONPROFILEIMPORTTIME": "1"}, timeout=240) as server:
        body = {"prompt": "Draw a red cube, then describe it.",
                "stage_params": {"generation": {"width": 64, "height": 64, "num_frames": 5,
                                                "num_inference_steps": 1, "seed": 7}}}
        response = httpx.post(f"{server.url}/generate", json=body, timeout=200)
        assert response.status_code == 200, response.text
        log = server.log()
    imported = {m.split(".")[0] for m in IMPORT_LINE.findall(log)}
    # the stage processes print their imports into the same log: the engines' heavy packages
    assert {"torch", "transformers", "diffusers", "uvicorn", "websockets"} <= imported
    missing = {module: dists for module, dists in distributions_of(imported).items()
               if not dists & needed and not any(wheels.TORCH_STACK.match(d) for d in dists)}
    assert not missing, (
        f"the server imported {missing} (module: distributions), which pyproject.toml's base "
        "dependencies and hf extra do not bring: declare them")
