"""What the Makefile installs, read from ``make -n`` (nothing is installed here): ``make demo``
installs the hf extra and no dev tools, with pip's progress shown; ``make test`` after it
installs the rest (the dev tools and the ray extra, which the tests need); a target whose extras
are installed installs nothing; ``VENV_FLAGS`` reaches ``python -m venv``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]


def make_n(target: str, venv: Path, *args: str) -> list[str]:
    # Run as a top-level make: under `make test` the inherited MAKELEVEL and MAKEFLAGS would make
    # it a sub-make that prints "Entering/Leaving directory" lines around its commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "-n", target, f"VENV={venv}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def pip_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line]


def fake_venv(venv: Path, *stamps: str) -> None:
    """A venv folder as the Makefile leaves it: its python and the given stamps."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    for stamp in stamps:
        (venv / stamp).touch()


def test_make_demo_installs_the_hf_extra_alone_and_shows_progress(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines = make_n("demo", venv)
    assert any(line.startswith("python3 -m venv") and line.endswith(str(venv)) for line in lines)
    assert [line.split()[-1] for line in pip_lines(lines)] == ["'.[hf]'"]
    assert not any("--quiet" in line or " -q " in line for line in pip_lines(lines))
    assert "serve --demo" in lines[-1]
    assert [line.split()[-1] for line in pip_lines(make_n("serve-demo", venv))] == ["'.[hf]'"]


def test_make_test_after_make_demo_installs_the_rest(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    fake_venv(venv, ".installed-hf")  # what `make demo` left
    assert pip_lines(make_n("demo", venv)) == []
    lines = make_n("test", venv)
    assert not any("-m venv" in line for line in lines)
    assert [line.split()[-1] for line in pip_lines(lines)] == ["'.[dev,hf,ray]'"]
    assert not any("--quiet" in line for line in pip_lines(lines))
    assert "-m pytest" in lines[-1]
    for target in ("lint", "bench"):
        assert [line.split()[-1] for line in pip_lines(make_n(target, venv))] == \
            ["'.[dev,hf,ray]'"]


def test_installed_extras_are_not_installed_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    fake_venv(venv, ".installed-hf", ".installed-dev-hf-ray")  # what `make test` left
    for target in ("demo", "serve-demo", "test"):
        assert pip_lines(make_n(target, venv)) == [], target


def test_make_test_on_a_fresh_clone_installs_everything_the_tests_need(tmp_path: Path) -> None:
    """``.ci/run`` runs ``make test`` on a clean clone."""
    lines = make_n("test", tmp_path / "venv")
    assert [line.split()[-1] for line in pip_lines(lines)] == ["'.[dev,hf,ray]'"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_venv_flags_reach_the_venv(tmp_path: Path) -> None:
    lines = make_n("demo", tmp_path / "venv", "VENV_FLAGS=--system-site-packages")
    assert any(line.startswith("python3 -m venv --system-site-packages") for line in lines)
