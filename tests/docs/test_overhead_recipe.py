"""The README's side-by-side overhead recipe runs as written (README.md, "What Omni itself
costs"): in a clone of this repository, the block's commands, with ``--quick`` runs, one
iteration instead of three and a scratch folder for ``/tmp``, measure the old commit's checkout
and this one, and each run writes its figures with the commit it measured."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BLOCK = re.compile(r"^```bash tested-by=tests/docs/test_overhead_recipe.py\n(.*?)^```", re.M | re.S)


@pytest.mark.slow
def test_the_readme_side_by_side_overhead_recipe_runs(tmp_path: Path) -> None:
    found = BLOCK.search((ROOT / "README.md").read_text())
    assert found, "README.md has no block tested here"
    block = found[1]
    assert "worktree add /tmp/base" in block and "for i in 1 2 3" in block, block
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    quick = (block.replace("/tmp/", f"{scratch}/").replace("for i in 1 2 3", "for i in 1")
             .replace("--runs 1", "--runs 1 --quick"))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", quick], cwd=clone,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    base = json.loads((scratch / "base_1.json").read_text())
    now = json.loads((scratch / "now_1.json").read_text())
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=clone,
                          capture_output=True, text=True, check=True).stdout.strip()
    old = re.search(r"worktree add /tmp/base (\w+)", block)
    assert old and base["commit"].startswith(old[1]) and now["commit"].startswith(head)
    for measured in (base, now):
        assert measured["runs"][0]["clients16_req_s"] > 0
