"""Pipeline config: defaults, file, flags, and every startup refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_omni.config import load_config, parse_overrides
from sglang_omni.errors import ConfigError

SPEC_YAML = """\
config_cls: Cosmos3UMMPipelineConfig
model_path: /path/to/Cosmos3-Nano
stages:
  generation:
    factory:
      output_dir: outputs/cosmos3
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cosmos3.yaml"
    path.write_text(text)
    return path


def test_spec_yaml_default_placement(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, SPEC_YAML), visible_gpus=2)
    assert cfg.config_cls == "Cosmos3UMMPipelineConfig"
    assert cfg.stage("generation").gpu == 0
    assert cfg.stage("reasoner").gpu == 1
    assert cfg.stage("orchestrator").gpu is None and not cfg.stage("orchestrator").process
    assert cfg.stage("generation").factory["output_dir"] == "outputs/cosmos3"
    assert cfg.stage("generation").backend == "native"
    orch = cfg.stage("orchestrator").factory
    assert (orch["max_dispatches"], orch["max_outputs"], orch["max_active"]) == (17, 17, 32)
    assert orch["max_retained_bytes"] == 128 * 1024 * 1024 and orch["timeout_s"] == 3600


def test_flags_outrank_file(tmp_path: Path) -> None:
    text = SPEC_YAML + "  reasoner:\n    gpu: 1\n    engine:\n      context_length: 8192\n"
    overrides = parse_overrides(["--reasoner.gpu", "3", "--generation.factory.output_dir=out",
                                 "--reasoner.engine.context_length", "32768"])
    cfg = load_config(write(tmp_path, text), overrides, visible_gpus=4)
    assert cfg.stage("reasoner").gpu == 3
    assert cfg.stage("generation").factory["output_dir"] == "out"
    assert cfg.stage("reasoner").engine["context_length"] == 32768


def test_text_only_needs_no_file() -> None:
    cfg = load_config(None, model_path="/m", text_only=True, visible_gpus=1)
    assert cfg.config_cls == "Cosmos3ReasonerPipelineConfig"
    assert list(cfg.stages) == ["reasoner"] and cfg.stage("reasoner").gpu == 0


def test_gpu_null_runs_scripted_on_cpu() -> None:
    over = parse_overrides(["--reasoner.gpu", "null", "--reasoner.factory.backend", "scripted"])
    cfg = load_config(None, over, model_path="/m", text_only=True, visible_gpus=0)
    assert cfg.stage("reasoner").gpu is None


@pytest.mark.parametrize(("text", "overrides", "needle"), [
    (SPEC_YAML + "  painter:\n    gpu: 0\n", [], "stages.painter"),
    (SPEC_YAML + "  reasoner:\n    gpus: 1\n", [], "stages.reasoner.gpus"),
    (SPEC_YAML, ["--generation.factory.colour", "red"], "stages.generation.factory.colour"),
    (SPEC_YAML.replace("Cosmos3UMMPipelineConfig", "NoSuchConfig"), [], "config_cls"),
    (SPEC_YAML, ["--reasoner.gpu", "one"], "stages.reasoner.gpu"),
    (SPEC_YAML, ["--orchestrator.factory.max_active", "many"],
     "stages.orchestrator.factory.max_active"),
    (SPEC_YAML, ["--reasoner.gpu_memory_fraction", "1.5"], "stages.reasoner.gpu_memory_fraction"),
    (SPEC_YAML, ["--reasoner.gpu", "5"], "needs 6 visible GPU(s) but 2 are visible"),
    (SPEC_YAML, ["--reasoner.gpu", "null"], "backend needs a GPU"),
    (SPEC_YAML, ["--generation.factory.backend", "tpu"], "stages.generation.factory.backend"),
])
def test_refusals_name_key(tmp_path: Path, text: str, overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), parse_overrides(overrides), visible_gpus=2)
    assert needle in str(err.value)


def test_default_placement_needs_two_gpus(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"stages.reasoner.gpu: 1 needs 2 visible GPU\(s\)"):
        load_config(write(tmp_path, SPEC_YAML), visible_gpus=1)


def run_cli(*args: str, env_gpus: str = "") -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": env_gpus}
    return subprocess.run([sys.executable, "-m", "sglang_omni", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_config_resolve_prints_merged_config(tmp_path: Path) -> None:
    out = run_cli("config", "resolve", "--config", str(write(tmp_path, SPEC_YAML)),
                  "--generation.factory.output_dir", "elsewhere", env_gpus="0,1")
    assert out.returncode == 0, out.stderr
    merged = json.loads(out.stdout)
    assert merged["stages"]["generation"]["factory"]["output_dir"] == "elsewhere"
    assert merged["stages"]["reasoner"]["gpu"] == 1


def test_serve_refuses_bad_config_with_nonzero_exit(tmp_path: Path) -> None:
    out = run_cli("serve", "--config", str(write(tmp_path, SPEC_YAML)), "--reasoner.gpu", "7",
                  env_gpus="0,1")
    assert out.returncode != 0
    assert "stages.reasoner.gpu: 7 needs 8 visible GPU(s) but 2 are visible" in out.stderr


def test_help_works() -> None:
    out = run_cli("--help")
    assert out.returncode == 0 and "serve" in out.stdout


def test_model_packages_register_pipelines_outside_omni(tmp_path: Path) -> None:
    """``model_packages`` names the module whose import registers a model package's pipelines;
    its model (limits, defaults) is what the pipeline serves."""
    text = "model_packages: [tests.toy_model]\nconfig_cls: ToyPipelineConfig\n" \
           "stages: {generation: {gpu: null, factory: {backend: scripted}}}\n"
    config = load_config(write(tmp_path, text))
    assert config.model_packages == ("tests.toy_model",)
    assert config.pipeline().__name__ == "ToyPipelineConfig"
    assert config.pipeline().model.max_side == 512
    assert config.to_dict()["model_packages"] == ["tests.toy_model"]
    assert "model_packages" not in load_config(write(tmp_path, SPEC_YAML),
                                               visible_gpus=2).to_dict()


@pytest.mark.parametrize(("value", "needle"), [
    ("[no_such_module_for_omni]", "model_packages: cannot import 'no_such_module_for_omni'"),
    ("{a: 1}", "model_packages: expected a list of module names"),
    ('[".x"]', "model_packages: '.x' is not a module name"),  # was a TypeError traceback
    ("['a b']", "model_packages: 'a b' is not a module name"),
    ("[1]", "model_packages: 1 is not a module name"),
])
def test_model_packages_refusals_name_the_key(tmp_path: Path, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path, f"model_packages: {value}\n{SPEC_YAML}"), visible_gpus=2)


def test_a_bad_model_package_is_a_configuration_error_exit_2(tmp_path: Path) -> None:
    """``model_packages: [".x"]`` crashed with a TypeError traceback and exit 1; a module that
    fails as it is imported did too."""
    (tmp_path / "broken_omni_models.py").write_text("raise RuntimeError('half written')\n")
    for value, says in (('[".x"]', "model_packages: '.x' is not a module name"),
                        ("[broken_omni_models]", "model_packages: importing "
                         "'broken_omni_models' failed (RuntimeError: half written)")):
        config = write(tmp_path, f"model_packages: {value}\n{SPEC_YAML}")
        out = subprocess.run([sys.executable, "-m", "sglang_omni", "config", "resolve",
                              "--config", str(config)], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
