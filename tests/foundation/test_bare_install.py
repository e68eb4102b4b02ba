"""The package imports with only its declared base dependencies installed: every module of the
core (all but the hf and native engines, ``scale/`` and the two torch checkpoint builders,
``test_declared_dependencies.EXTRA_OF``) is imported in a fresh virtual environment that holds
nothing else, so a package that arrives only with the dev, hf or ray extras (or with another
package) and is imported unguarded fails here.

The environment is made without the network and without pip: ``python -m venv --without-pip``
(no system site-packages), then the distributions the base dependencies need (the closure of
``pyproject.toml``'s ``dependencies`` through each installed distribution's ``Requires-Dist``,
extras and non-matching markers left out) are linked from this interpreter's installed copies,
top-level entry by entry (each distribution's ``RECORD``). That is what ``pip install .`` would
install, at the versions this checkout is tested with; it takes about a second.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.foundation.test_declared_dependencies import EXTRA_OF

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sglang_omni"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_closure() -> dict[str, md.Distribution]:
    """The installed distributions the base dependencies need, by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [(Requirement(spec), frozenset[str]()) for spec in project["dependencies"]]
    found: dict[str, md.Distribution] = {}
    extras_seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, _ = todo.pop()
        name = canonical(req.name)
        key = (name, frozenset(req.extras))
        if key in extras_seen:
            continue
        extras_seen.add(key)
        dist = found.get(name) or md.distribution(name)
        found[name] = dist
        for spec in dist.requires or []:
            sub = Requirement(spec)
            environments = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in environments):
                todo.append((sub, frozenset()))
    return found


def link_distributions(dists: dict[str, md.Distribution], site: Path) -> None:
    """Link each distribution's top-level entries (package folders, modules, ``.dist-info``,
    ``.libs``) from where it is installed into ``site``."""
    for dist in dists.values():
        origin = Path(str(dist.locate_file("")))
        for entry in {Path(str(f)).parts[0] for f in dist.files or []}:
            if entry in ("..", "__pycache__") or entry.endswith(".pth"):
                continue
            source, target = origin / entry, site / entry
            if source.exists() and not target.exists():
                target.symlink_to(source)


def core_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "__main__.py" or any(rel.startswith(folder) for folder in EXTRA_OF):
            continue
        parts = ["sglang_omni", *Path(rel).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules.append(".".join(parts))
    return modules


IMPORT_ALL = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ":\\n" + traceback.format_exc(limit=3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_core_modules_import_with_only_the_base_dependencies(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    dists = base_closure()
    assert "sglang-omni" not in dists
    link_distributions(dists, site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONPATH"] = str(ROOT)  # the package from this checkout, nothing else of it installed
    modules = core_modules()
    assert len(modules) > 100
    done = subprocess.run([str(python), "-c", IMPORT_ALL, *modules], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, f"modules failed to import:\n{done.stdout}\n{done.stderr}"
    # the environment really is bare: no dev tool, no extra, no site-packages of ours
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, sys; "
         "print([m for m in ('pytest', 'torch', 'ray', 'openai', 'hypothesis') if u.find_spec(m)]"
         ", sys.prefix)"], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.startswith("[] "), probe.stdout
    assert sysconfig.get_paths()["purelib"] != str(site)
