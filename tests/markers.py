"""Which tests start processes: the rule behind the ``server`` marker (applied in conftest.py).

A test is a server test when the code it runs, its own or a fixture's, starts a process: it
refers to :class:`tests.server.Server` (an ``sgl-omni serve`` process) or starts a
:class:`~sglang_omni.runtime.stage.handle.StageHandle` (a stage process), directly or through
helpers, fixtures and classes of the test packages. The scan reads the names each function's
code uses (nested functions and lambdas included) and resolves them in its module, so a new test
is marked without a list to keep. ``tests.server`` checks the rule at run time: a test without
the marker that starts a server fails.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Any

import pytest

from sglang_omni.runtime.stage.handle import StageHandle
from tests.server import Server

#: Methods that spawn a stage process, counted when the same code also reaches a StageHandle.
_STAGE_STARTS = frozenset({"start", "respawn"})


def server_tests(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items whose test function, or a fixture they use, starts a process."""
    scan = _Scan()
    return [item for item in items if _item_starts(scan, item)]


def _item_starts(scan: _Scan, item: pytest.Item) -> bool:
    if scan.starts(getattr(item, "obj", None)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    if any(scan.starts(d.func) for name in getattr(item, "fixturenames", ())
           for d in defs.get(name, ())):
        return True
    return any(scan.starts(func) for func in _fixtures_by_name(item))


def _fixtures_by_name(item: pytest.Item) -> Iterator[Any]:
    """The functions of fixtures a test may ask for at run time (``getfixturevalue``): every
    string of its code or parameters that names a fixture it can see."""
    test = _unwrap(getattr(item, "obj", None))
    if not isinstance(test, FunctionType) or "getfixturevalue" not in set(_names(test.__code__)):
        return
    params = getattr(getattr(item, "callspec", None), "params", {})
    strings = set(_strings(test.__code__)) | {v for v in params.values() if isinstance(v, str)}
    manager = item.session._fixturemanager
    for name in sorted(s for s in strings if s.isidentifier()):
        for fixture in manager.getfixturedefs(name, item) or ():
            yield fixture.func


class _Scan:
    """Verdicts per function or class, memoized (helpers are shared between tests); a cycle of
    helpers counts as no start."""

    def __init__(self) -> None:
        self._starts: dict[int, bool] = {}
        self._handles: dict[int, bool] = {}

    def starts(self, obj: Any) -> bool:
        """Whether calling ``obj`` starts a server or a stage process."""
        return self._verdict(obj, Server, self._starts, self._code_starts)

    def handles(self, obj: Any) -> bool:
        """Whether ``obj`` is, makes or gets a StageHandle (refers to the class)."""
        return self._verdict(obj, StageHandle, self._handles, self._code_handles)

    def _verdict(self, obj: Any, target: type, memo: dict[int, bool], check: Any) -> bool:
        obj = _unwrap(obj)
        if obj is target or (isinstance(obj, type) and issubclass(obj, target)):
            return True
        key = id(obj)
        if key not in memo:
            memo[key] = False
            memo[key] = any(check(code, scope) for code, scope in _code_of(obj))
        return memo[key]

    def _code_starts(self, code: CodeType, scope: dict[str, Any]) -> bool:
        names = set(_names(code))
        found = _resolve(names, scope)
        if names & _STAGE_STARTS and any(self.handles(obj) for obj in found):
            return True
        return any(self.starts(obj) for obj in found)

    def _code_handles(self, code: CodeType, scope: dict[str, Any]) -> bool:
        return any(self.handles(obj) for obj in _resolve(set(_names(code)), scope))


def _resolve(names: set[str], scope: dict[str, Any]) -> list[Any]:
    """What ``names`` are in a module's globals: StageHandle, Server and objects of the test
    packages; for a test-package module (``kit.umm_server(...)``), its attributes of those
    names."""
    found = []
    for name in names & scope.keys():
        obj = scope[name]
        if isinstance(obj, ModuleType) and _ours(obj):
            found += [getattr(obj, n) for n in names if hasattr(obj, n)]
        else:
            found.append(obj)
    return [obj for obj in found if not isinstance(obj, ModuleType)
            and (obj is Server or obj is StageHandle or _ours(obj))]


def _unwrap(obj: Any) -> Any:
    """The function behind a fixture definition, method, partial or decorated function."""
    if hasattr(obj, "_get_wrapped_function"):  # a pytest fixture definition
        obj = obj._get_wrapped_function()
    obj = getattr(obj, "__func__", obj)  # bound and class methods
    if isinstance(obj, functools.partial):
        obj = obj.func
    try:
        return inspect.unwrap(obj) if callable(obj) else obj
    except ValueError:  # a __wrapped__ cycle
        return obj


def _ours(obj: Any) -> bool:
    """Whether ``obj`` was defined in the test packages (only their code is scanned)."""
    module = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "tests" or module.startswith("tests."))


def _code_of(obj: Any) -> Iterator[tuple[CodeType, dict[str, Any]]]:
    """The code objects of a function, or of every method of a test-package class."""
    if isinstance(obj, FunctionType):
        yield obj.__code__, obj.__globals__
    elif isinstance(obj, type) and _ours(obj):
        for attr in vars(obj).values():
            attr = getattr(attr, "__func__", attr)  # staticmethod, classmethod
            attr = getattr(attr, "fget", attr)  # property
            if isinstance(attr, FunctionType):
                yield attr.__code__, attr.__globals__


def _names(code: CodeType) -> Iterator[str]:
    """Global and attribute names ``code`` uses, with those of the code nested in it."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _names(const)


def _strings(code: CodeType) -> Iterator[str]:
    """The string constants of ``code`` and of the code nested in it."""
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, CodeType):
            yield from _strings(const)
