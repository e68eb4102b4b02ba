"""The toy model's distribution metadata: how a model package outside Omni registers itself.

An installed model package declares, in its ``pyproject.toml``::

    [project.entry-points."sglang_omni.models"]
    toy = "tests.toy_model"

Installing it writes a ``.dist-info`` folder whose ``entry_points.txt`` holds that entry point.
The tests install nothing (the shared environment stays as it is): :func:`write_distribution`
writes the same folder into a private one, which a server subprocess gets on its
``PYTHONPATH`` (:func:`pythonpath_with`), and ``importlib.metadata`` finds it there as it finds
an installed one.
"""

from __future__ import annotations

import os
from pathlib import Path

GROUP = "sglang_omni.models"
DIST_NAME = "sglang_omni_toy_model"
DIST_VERSION = "1.0"


def write_distribution(folder: Path, entry_points: dict[str, str] | None = None) -> Path:
    """Write a ``.dist-info`` into ``folder`` declaring ``entry_points`` (name -> module) in the
    ``sglang_omni.models`` group (default: the toy model's); returns the folder."""
    points = entry_points if entry_points is not None else {"toy": "tests.toy_model"}
    info = folder / f"{DIST_NAME}-{DIST_VERSION}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n"
        "Summary: the SGLang Omni test suite's toy model package\n", encoding="utf-8")
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}", encoding="utf-8")
    return folder


def pythonpath_with(folder: Path) -> str:
    """This process's ``PYTHONPATH`` with ``folder`` added (the checkout stays importable)."""
    current = os.environ.get("PYTHONPATH")
    return f"{current}{os.pathsep}{folder}" if current else str(folder)
