"""The omni_generation_cancellation plugin against the real SGLang 0.5.23 loader (native tier).

One probe run (``probe.py``, about a minute on the CPU) acts as the generation stage: it
provides the plugin as the stage does, starts workers the way native SGLang starts them, and an
unrelated SGLang process beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang_omni.engines.native import cancellation_plugin as plugin  # noqa: E402

pytestmark = pytest.mark.native
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("probe") / "report.json"
    run = subprocess.run([sys.executable, "-m", "tests.native_generation.probe", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_stage_process_itself_does_not_load_the_plugin(probe: dict) -> None:
    assert probe["stage"]["omni_hooks"] == []
    assert probe["stage"]["pid"] not in [r["pid"] for r in probe["registrations"]]


def test_workers_started_by_native_bootstrap_load_the_plugin(probe: dict) -> None:
    by_pid = {r["pid"]: r for r in probe["registrations"]}
    report = by_pid[probe["bootstrap"]["pid"]]  # the real bootstrap_scheduler_process
    assert report["process"] == "sglang-diffusionWorker-0"
    assert sorted(report["targets"]) == sorted(plugin.HOOK_TARGETS)


def test_hook_targets_resolve_and_are_patched_in_the_pinned_release(probe: dict) -> None:
    worker = probe["worker"]
    assert worker["omni_hooks"] == sorted(plugin.HOOK_TARGETS)
    assert worker["patched"] == sorted(plugin.HOOK_TARGETS)
    assert worker["step_wrapped"] and worker["loop_wrapped"]
    assert worker["step_signature"].startswith("(self, step_index: int, num_steps: int)")
    assert worker["loop_signature"].startswith("(self, batch: ")


def test_a_hooked_denoising_step_raises_when_its_request_is_cancelled(probe: dict) -> None:
    worker = probe["worker"]
    assert worker["steps_run"] == [0, 1, 2]  # cancelled after step 2: step 3 never starts
    assert worker["step_error"] == "cancelled by SGLang Omni at denoising step 3 of 6"
    assert worker["loop_error"] == "cancelled by SGLang Omni before its first denoising step"


def test_other_sglang_processes_do_not_see_the_plugin(probe: dict) -> None:
    assert plugin.PLUGIN_NAME not in probe["outsider"]["entry_points"]
    assert not set(plugin.HOOK_TARGETS) & set(probe["outsider"]["hooked_targets"])
    assert probe["site_removed"]
