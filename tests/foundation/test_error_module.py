"""One error module: every OmniError class lives in ``sglang_omni.errors``, and no module but the
wire module (``sglang_omni.serve.wire.http_errors``) writes an HTTP status literal."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import sglang_omni
from sglang_omni import errors
from sglang_omni.errors import (
    ERROR_TYPES,
    BadRequest,
    MediaFetchFailed,
    MediaNotFound,
    NativeRefusal,
    OmniError,
)

PACKAGE = Path(sglang_omni.__file__).parent
#: The one module allowed to name HTTP statuses besides ``sglang_omni/errors.py``.
WIRE_MODULE = PACKAGE / "serve" / "wire" / "http_errors.py"
#: The issue's check: ``grep -rn "status_code=4\|status_code=5\|499" sglang_omni``.
ISSUE_RULE = re.compile(r"status_code=4|status_code=5|499")
#: A status chosen by assignment or keyword (``status=400``, ``"status": 500``...).
STATUS_LITERAL = re.compile(
    r"""\bstatus(_code)?\s*=\s*[45]\d\d\b|["']status["']\s*:\s*[45]\d\d\b""")


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def _import_package() -> list[str]:
    """Import every module of the package; those needing an absent extra (torch, sglang...)
    are skipped. Returns the names imported."""
    imported = []
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="sglang_omni."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
        imported.append(info.name)
    return imported


def test_every_omni_error_is_defined_in_the_errors_module() -> None:
    imported = _import_package()
    assert "sglang_omni.serve.app" in imported and "sglang_omni.engines.scripted" in imported
    elsewhere = sorted(f"{cls.__module__}.{cls.__qualname__}"
                       for cls in _all_subclasses(OmniError)
                       if cls.__module__.startswith("sglang_omni.")
                       and cls.__module__ != errors.__name__)
    assert elsewhere == [], "define these OmniError classes in sglang_omni/errors.py"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_only_the_wire_module_writes_http_status_literals() -> None:
    offending = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
                 for path in _sources() if path != WIRE_MODULE
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if ISSUE_RULE.search(line)]
    assert offending == []


def test_no_module_chooses_a_status_by_assignment() -> None:
    allowed = {WIRE_MODULE, PACKAGE / "errors.py"}
    offending = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
                 for path in _sources() if path not in allowed
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if STATUS_LITERAL.search(line)]
    assert offending == []


def test_error_types_come_from_the_one_map() -> None:
    classes = _all_subclasses(OmniError) | {OmniError}
    for cls in classes:
        if cls.__module__ == errors.__name__:
            assert cls.type == errors.error_type(cls.status), cls.__name__
    assert errors.error_type(429) == "invalid_request_error"
    assert errors.error_type(502) == "server_error"
    assert {s: errors.error_type(s) for s in ERROR_TYPES} == ERROR_TYPES


def test_typed_media_and_native_errors_carry_their_status() -> None:
    assert (MediaFetchFailed("x").status, MediaFetchFailed("x").type) == (500, "server_error")
    not_found = MediaNotFound("x")
    # a client error is not a kind of server failure: `except MediaFetchFailed` must not take it
    assert isinstance(not_found, BadRequest) and not isinstance(not_found, MediaFetchFailed)
    assert not_found.to_body() == {"error": {"message": "x", "type": "invalid_request_error",
                                             "code": 400}}
    assert (NativeRefusal("x").status, NativeRefusal("x").type) == (400, "invalid_request_error")
    assert NativeRefusal("x", 503).type == "service_unavailable"
