"""Providing the cancellation plugin to the stage's native generation workers, and to no one else.

The multimodal_gen plugin loader finds plugins through the entry points of the distributions on
the import path. Instead of an installation step, the stage writes a minimal distribution (a
``.dist-info`` folder whose ``entry_points.txt`` names
``sglang_omni.engines.native.cancellation_plugin:register``) into a private temporary folder,
then, in this order:

1. runs its own plugin registration (the loader registers once per process), so the stage
   process itself, which also hosts ``DiffGenerator``, never loads the plugin;
2. adds the folder to its ``sys.path`` and ``PYTHONPATH``. Native SGLang spawns its workers
   with ``multiprocessing`` (spawn), and a spawned child takes its parent's ``sys.path``, so the
   loader in each worker finds the entry point.

Nothing is installed: every other SGLang process on the machine (the Reasoner stage, another
server) cannot see the entry point. The folder goes away when the stage closes. Each worker
that registers the plugin leaves a report in ``status/`` (see ``cancellation_plugin``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglang_omni.engines.native.cancellation_plugin import (
    ENTRY_POINT_GROUP,
    PLUGIN_NAME,
    STATUS_DIR_ENV,
)

DIST_NAME = "sglang_omni_generation_cancellation"
DIST_VERSION = "1.0"
ENTRY_POINT = "sglang_omni.engines.native.cancellation_plugin:register"


def write_distribution(folder: Path) -> Path:
    """Write the plugin's ``.dist-info`` into ``folder``; returns its path."""
    info = folder / f"{DIST_NAME}-{DIST_VERSION}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {DIST_VERSION}\n"
        "Summary: SGLang Omni generation cancellation, for this stage's workers only\n",
        encoding="utf-8")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n{PLUGIN_NAME} = {ENTRY_POINT}\n", encoding="utf-8")
    return info


class CancellationPluginSite:
    """The private folder that provides the plugin to workers started after :meth:`activate`."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="sgl-omni-plugin-", dir=base))
        self.status_dir = self.path / "status"
        self.status_dir.mkdir()
        write_distribution(self.path)
        self._saved_env: dict[str, str | None] = {}

    def activate(self, register_own_plugins: Callable[[], None]) -> None:
        """Run this process's plugin registration, then expose the plugin to its children."""
        register_own_plugins()
        entry = str(self.path)
        if entry not in sys.path:
            sys.path.append(entry)
        importlib.invalidate_caches()
        pythonpath = os.environ.get("PYTHONPATH")
        self._saved_env = {"PYTHONPATH": pythonpath,
                           STATUS_DIR_ENV: os.environ.get(STATUS_DIR_ENV)}
        os.environ["PYTHONPATH"] = entry if not pythonpath else f"{pythonpath}{os.pathsep}{entry}"
        os.environ[STATUS_DIR_ENV] = str(self.status_dir)

    def registrations(self) -> list[dict[str, Any]]:
        """The reports of the workers that registered the plugin so far."""
        out = []
        for report in sorted(self.status_dir.glob("*.json")):
            try:
                out.append(json.loads(report.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue
        return out

    def close(self) -> None:
        """Take the folder off the import path and the environment, and remove it."""
        entry = str(self.path)
        if entry in sys.path:
            sys.path.remove(entry)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}
        shutil.rmtree(self.path, ignore_errors=True)
