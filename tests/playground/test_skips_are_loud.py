"""A run without chromium says loudly, at its end, that the browser tests were skipped and how
to install it (``make test -q`` would show only a skip count), and still passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_a_run_without_chromium_says_the_browser_tests_were_skipped(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SGL_OMNI_CHROMIUM"}
    env["PATH"] = str(tmp_path)  # no chromium on it (the interpreter is named in full)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/playground/test_random_weights_notice.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    last = run.stdout.strip().splitlines()
    loud = next(line for line in last if "BROWSER TESTS SKIPPED" in line)
    assert "2 BROWSER TESTS SKIPPED: the playground was not tested" in loud
    assert "no chromium: apt-get install -y chromium" in loud
    assert "2 skipped" in last[-1]
