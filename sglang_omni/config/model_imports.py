"""Importing the modules a config's ``model_packages`` names.

A name is an absolute dotted module name (``mypackage.models``): anything else is refused as a
configuration error naming it. A module is looked up on the Python path and, failing that, in
the current directory, as ``python -m`` finds it: the ``sgl-omni`` console script has no
current directory on its path, so a model package in the directory it is run from (the
documented ``tests.toy_model`` from a checkout's root) was not found, while ``python -m
sglang_omni`` found it. A module that fails while it is imported is a configuration error too
(its message named; import it in Python to see its traceback).

Model packages are found first by entry point: every distribution on the import path may
declare, in its group ``sglang_omni.models`` (:data:`GROUP`), entry points each naming a module
whose import registers its pipelines (``[project.entry-points."sglang_omni.models"]`` in its
``pyproject.toml``). Omni's own ``pyproject.toml`` declares the built-in model that way
(:data:`BUILT_IN`). The built-in is loaded even when the installed metadata lacks its entry point
(an install from before it, an editable install not reinstalled since): :func:`model_entry_points`
always lists :data:`BUILT_IN` first, then every other distribution's entry points by name.

This module is the one place in Omni that imports code by a name it does not spell out: the
entry points, the config's ``model_packages`` and, for tests, the diffusion driver
:func:`load_named` loads. Everywhere else an import is a literal ``import`` statement, which the
import-graph test sees (tests/foundation/test_import_graph.py).
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import EntryPoint, distributions
from types import ModuleType
from typing import Any

from sglang_omni.errors import ConfigError

#: The entry point group of model packages.
GROUP = "sglang_omni.models"
#: The built-in model's entry point, as Omni's pyproject.toml declares it.
BUILT_IN = EntryPoint(name="cosmos3", value="sglang_omni.models.cosmos3", group=GROUP)


def model_entry_points(path: list[str] | None = None) -> list[EntryPoint]:
    """The ``sglang_omni.models`` entry points of the distributions on ``path`` (default: the
    import path): :data:`BUILT_IN` first, whether or not its distribution's metadata declares it,
    then the others sorted by name, each module once."""
    found = {BUILT_IN.value: BUILT_IN}
    dists = distributions(path=path) if path is not None else distributions()
    others = sorted((ep for dist in dists for ep in dist.entry_points if ep.group == GROUP),
                    key=lambda ep: (ep.name, ep.value))
    for ep in others:
        found.setdefault(ep.value, ep)
    return list(found.values())


def load_entry_point(ep: EntryPoint) -> Any:
    """Load ``ep`` (import the module it names, which registers its pipelines); ConfigError
    naming the entry point when that fails."""
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - a model package's own code failed as imported
        raise ConfigError(
            f"the {GROUP} entry point {ep.name} = {ep.value} failed to load "
            f"({type(exc).__name__}: {exc}); fix or uninstall the distribution that declares it "
            f"(python -c 'import {ep.module}' shows where)") from exc


def load_named(target: str) -> Any:
    """The attribute a "module:attribute" string names (a dotted attribute path too); the
    caller names what it is for in its own errors."""
    module, _, name = target.partition(":")
    found: Any = importlib.import_module(module)
    for attr in filter(None, name.split(".")):
        found = getattr(found, attr)
    return found


def check_module_name(name: object) -> str:
    """``name`` if it is an absolute dotted module name; ConfigError naming it otherwise."""
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"model_packages: {name!r} is not a module name; give absolute dotted "
                          "names of importable modules, such as mypackage.models")
    return name


def import_model_package(name: str) -> ModuleType:
    """Import the module ``name`` (see the module docstring); ConfigError when it cannot be
    imported or fails as it is."""
    check_module_name(name)
    try:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not _top_level_missing(name, exc) or not _add_cwd():
                raise
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if _top_level_missing(name, exc):
                sys.path.remove(os.getcwd())  # not found there either: the path as it was
            raise
    except ImportError as exc:
        raise ConfigError(f"model_packages: cannot import {name!r} ({exc}); name an importable "
                          "module that registers pipelines (on the Python path or in the "
                          "current directory)") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own code failed as it was imported
        raise ConfigError(f"model_packages: importing {name!r} failed ({type(exc).__name__}: "
                          f"{exc}); run python -c 'import {name}' to see where") from exc


def _top_level_missing(name: str, exc: ModuleNotFoundError) -> bool:
    return exc.name == name.partition(".")[0]


def _add_cwd() -> bool:
    """Append the current directory to ``sys.path`` unless it is there already (as itself or
    as ``""``); whether it was added."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        return False
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return True
