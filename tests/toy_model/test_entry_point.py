"""Model packages register by their ``sglang_omni.models`` entry point: a distribution's
metadata on the path is all it takes (no ``model_packages``), the built-in model loads even where
the installed metadata lacks its entry point, and an entry point that fails to load is a
configuration error naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml

from sglang_omni.config.model_imports import BUILT_IN, GROUP, load_entry_point, model_entry_points
from sglang_omni.errors import ConfigError
from tests.toy_model.distribution import pythonpath_with, write_distribution

HERE = Path(__file__).parent
DIRECT = HERE / "toy-direct-scripted.yaml"


def resolve(config: Path, pythonpath: str | None) -> subprocess.CompletedProcess[str]:
    """``sgl-omni config resolve`` in a fresh interpreter with ``pythonpath``."""
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "sglang_omni", "config", "resolve", "--config",
                           str(config)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=HERE.parents[1])


def test_the_toy_registers_by_its_entry_point_alone(tmp_path: Path) -> None:
    """The toy's direct config names no model package: with the toy's distribution metadata on
    the path its pipeline resolves; without it the config names an unknown class."""
    assert "model_packages" not in yaml.safe_load(DIRECT.read_text())
    with_toy = resolve(DIRECT, pythonpath_with(write_distribution(tmp_path)))
    assert with_toy.returncode == 0, with_toy.stderr
    assert "ToyPipelineConfig" in with_toy.stdout
    without = resolve(DIRECT, os.environ.get("PYTHONPATH"))
    assert without.returncode == 2
    assert "unknown pipeline config class 'ToyPipelineConfig'" in without.stderr
    assert "Cosmos3PipelineConfig" in without.stderr  # the built-in loads either way


def test_a_broken_entry_point_is_a_configuration_error(tmp_path: Path) -> None:
    site = write_distribution(tmp_path, {"broken": "no_such_module_for_omni_models"})
    result = resolve(DIRECT, pythonpath_with(site))
    assert result.returncode == 2
    assert ("the sglang_omni.models entry point broken = no_such_module_for_omni_models "
            "failed to load") in result.stderr
    assert "fix or uninstall the distribution that declares it" in result.stderr


def test_the_built_in_model_comes_first_even_without_its_metadata(tmp_path: Path) -> None:
    """A path with no distribution declaring the built-in (an install older than its entry
    point) still lists it; a distribution that declares it too lists it once; others follow."""
    assert model_entry_points([str(tmp_path)]) == [BUILT_IN]
    write_distribution(tmp_path, {"zeta": "tests.toy_model", "again": BUILT_IN.value})
    found = model_entry_points([str(tmp_path)])
    assert [ep.value for ep in found] == [BUILT_IN.value, "tests.toy_model"]
    assert found[0] == BUILT_IN and all(ep.group == GROUP for ep in found)


def test_load_entry_point_names_the_failure() -> None:
    with pytest.raises(ConfigError, match="entry point x = tests.toy_model.nope failed"):
        load_entry_point(EntryPoint(name="x", value="tests.toy_model.nope", group=GROUP))
