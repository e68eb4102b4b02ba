"""Every third-party package the code imports is declared in pyproject.toml: a module of the
core (everything but the hf and native engines and the Ray scale-out) imports only the core
dependencies; the hf engines, the native engines and ``scale/`` may add their extra's. A package
that arrives only as another's dependency (starlette through fastapi, h11 through uvicorn) can
change or vanish under us without a resolver noticing."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sglang_omni"
#: Folders (and files) of the package and the extra their imports may come from: the
#: checkpoint builders make torch checkpoints and run where the hf extra is installed.
EXTRA_OF = {"engines/hf/": "hf", "engines/native/": "native", "scale/": "ray",
            "models/cosmos3/nano_checkpoint.py": "hf", "models/cosmos3/tiny_checkpoint.py": "hf"}


def requirement_name(spec: str) -> str:
    return re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> dict[str, set[str]]:
    """The distributions each group declares: ``core`` and each extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": {requirement_name(s) for s in project["dependencies"]}}
    for extra, specs in project["optional-dependencies"].items():
        groups[extra] = {requirement_name(s) for s in specs}
    return groups


def imported_modules(path: Path) -> set[str]:
    """The top-level module names ``path`` imports (absolute imports, anywhere in the file)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def group_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE).as_posix()
    for folder, extra in EXTRA_OF.items():
        if rel.startswith(folder):
            return extra
    return "core"


def test_every_imported_package_is_declared() -> None:
    groups = declared()
    distributions = md.packages_distributions()
    undeclared: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        group = group_of(path)
        allowed = groups["core"] | groups.get(group, set())
        for module in sorted(imported_modules(path)):
            if module in sys.stdlib_module_names or module == "sglang_omni":
                continue
            # a module of an extra not installed here (sglang in the main tier) has no entry:
            # it must then be a distribution of its own name in the allowed group
            dists = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
            if not dists & allowed:
                undeclared.append(f"{path.relative_to(ROOT)} imports {module} "
                                  f"(from {', '.join(sorted(dists))}), not declared in {group}")
    assert not undeclared, "\n".join(undeclared)
