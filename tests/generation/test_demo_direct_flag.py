"""``sgl-omni serve --demo --direct``: direct generation on the hf backend and the tiny
checkpoint (unit: the resolved configuration; tests/hf/test_hf_direct.py serves it)."""

from __future__ import annotations

import pytest

from sglang_omni import cli


def test_demo_direct_resolves_the_generation_stage_alone() -> None:
    args, extra = cli.build_parser().parse_known_args(
        ["serve", "--demo", "--direct", "--model-path", "/models/tiny"])
    config = cli._resolve(args, extra)
    assert config.config_cls == "Cosmos3PipelineConfig" and list(config.stages) == ["generation"]
    assert config.stage("generation").factory["backend"] == "hf"
    assert config.stage("generation").gpu is None


def test_direct_needs_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--direct"]) == 2
    assert "--direct goes with --demo" in capsys.readouterr().err
