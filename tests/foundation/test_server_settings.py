"""The ``server:`` settings: file, dotted flags, --api-key and its environment variable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_omni.config import load_config, parse_overrides
from sglang_omni.config.server import API_KEY_ENV, ServerSettings
from sglang_omni.errors import ConfigError

SCRIPTED = "configs/cpu-scripted.yaml"


def test_defaults_allow_the_documented_sizes() -> None:
    s = load_config(SCRIPTED, visible_gpus=0).server
    assert s == ServerSettings()
    assert s.api_key is None
    for width, height in ((1280, 720), (1024, 1024)):
        assert width * height <= s.max_pixels
        assert max(width, height) / min(width, height) <= s.max_aspect_ratio
    assert s.max_frames >= 189 and s.max_inference_steps >= 100


def test_file_and_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(Path(SCRIPTED).read_text() + "server:\n  max_pixels: 100\n  max_frames: 9\n")
    s = load_config(cfg, parse_overrides(["--server.max_frames", "33"]), visible_gpus=0).server
    assert (s.max_pixels, s.max_frames) == (100, 33)


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--server.max_pixel", "1", "server.max_pixel: unknown setting"),
    ("--server.max_frames", "-1", "server.max_frames: -1 is below the minimum"),
    ("--server.max_frames", "2.5", "server.max_frames: expected a whole number"),
    ("--server.max_body_bytes", "true", "server.max_body_bytes: expected a number"),
    ("--server.api_key", "' '", "server.api_key: expected a non-empty string"),
    ("--server.max_client_media_bytes", "1000", "server.max_client_media_bytes: 1000 is below "
     "server.max_media_bytes"),
])
def test_refusals_name_the_setting(flag: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(SCRIPTED, parse_overrides([flag, value]), visible_gpus=0)
    assert needle in str(err.value)


def test_api_key_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert load_config(SCRIPTED, visible_gpus=0).server.api_key == "from-env"
    flagged = load_config(SCRIPTED, parse_overrides(["--server.api_key", "from-file"]),
                          visible_gpus=0)
    assert flagged.server.api_key == "from-file"
    assert load_config(SCRIPTED, visible_gpus=0, api_key="cli").server.api_key == "cli"


def test_config_resolve_never_prints_the_key() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglang_omni", "config", "resolve", "--config", SCRIPTED,
         "--api-key", "s3cret-key", "--server.max_frames", "33"],
        capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}).stdout
    assert "s3cret-key" not in out
    server = json.loads(out)["server"]
    assert server["api_key"] == "<set>" and server["max_frames"] == 33
