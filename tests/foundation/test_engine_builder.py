"""Building a stage's engine (``engines.base.build_engine``): a backend that reads a checkpoint
folder refuses a model_path that is none before it imports its libraries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = """
import sys
from sglang_omni.contract.job import EngineSpec
from sglang_omni.engines.base import build_engine
spec = EngineSpec(stage="reasoner", role="reasoner", backend="hf", model_path=sys.argv[1],
                  gpu=None, gpu_memory_fraction=None, factory={}, engine={})
try:
    build_engine(spec)
except RuntimeError as exc:
    print(exc)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""


@pytest.mark.parametrize("model_path", ["/none", "{file}", ""])
def test_the_hf_backend_refuses_a_model_path_that_is_no_folder_before_importing_torch(
        model_path: str, tmp_path: Path) -> None:
    a_file = tmp_path / "config.json"
    a_file.write_text("{}")
    path = model_path.format(file=a_file)
    out = subprocess.run([sys.executable, "-c", CHECK, path], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    if path:
        assert f"model_path {path!r} is not one; pass --model-path" in out, out
    else:
        assert "the hf backend needs model_path, the checkpoint's folder" in out, out
    assert out.strip().endswith("torch not imported"), out
