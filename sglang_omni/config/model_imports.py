"""Importing the modules a config's ``model_packages`` names.

A name is an absolute dotted module name (``mypackage.models``): anything else is refused as a
configuration error naming it. A module is looked up on the Python path and, failing that, in
the current directory, as ``python -m`` finds it: the ``sgl-omni`` console script has no
current directory on its path, so a model package in the directory it is run from (the
documented ``tests.toy_model`` from a checkout's root) was not found, while ``python -m
sglang_omni`` found it. A module that fails while it is imported is a configuration error too
(its message named; import it in Python to see its traceback).
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from sglang_omni.errors import ConfigError


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
