"""Package layering: imports point one way and packages form no cycle.

Layers, lowest first: errors, aio -> media, config -> contract -> engines -> runtime -> pipeline
-> models -> serve -> scale -> cli (scale, the Ray Serve deployment, runs whole servers: only the
CLI sits above it). A module may import its own package or any lower layer. media and config
share one level and may not import each other, nor may errors and aio (neither needs the other;
keeping them apart keeps both leaves of the graph). contract, the stage contract (jobs, results,
payloads, generation options, the engine and model interfaces), sits just above them so that
every layer may import it. client is a separate top: it may import errors and its own modules
only.

Some edges that point down are forbidden too (``FORBIDDEN``): serve, the HTTP layer, imports no
engine and no model package; it reaches the configured model through the ``contract.model``
interface its pipeline config names (``PipelineConfig.model``), so a model package added
without a change to serve serves through the same routes. Nor does serve import anything in
runtime (the stage handle, its IPC, the process helpers): pipeline is the only door to the
stages, for every mode (the orchestrator and ``pipeline.direct``), so every request holds a
request state and takes its admission ticket from ``pipeline.admission``.

Every ``import`` and ``from ... import`` counts, including those inside functions; a module
named by a string passed to ``importlib.import_module`` is a late binding through a table,
not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sglang_omni

PACKAGE_ROOT = Path(sglang_omni.__file__).parent
ROOT = "sglang_omni"

LAYER: dict[str, int] = {
    "errors": 0,
    "aio": 0,
    "media": 1,
    "config": 1,
    "contract": 2,
    "engines": 3,
    "runtime": 4,
    "pipeline": 5,
    "models": 6,
    "serve": 7,
    "scale": 8,
    "cli": 9,
}
#: Downward edges that are still forbidden, by (source package, target package).
FORBIDDEN = {("serve", "engines"), ("serve", "models"), ("serve", "runtime")}
CLIENT_MAY_IMPORT = {"client", "errors"}


def module_name(path: Path) -> str:
    """Dotted module name of a file under the package."""
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, module: str | None = None) -> list[str]:
    """Every sglang_omni module a file imports (absolute or relative, at any depth);
    ``module`` is the file's dotted name (derived from its path under the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    own = (module or module_name(path)).split(".")
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own if is_package else own[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            # `from sglang_omni import serve` names a package, not an attribute
            found.extend(f"{target}.{alias.name}" for alias in node.names if target == ROOT)
    return [name for name in found if name == ROOT or name.startswith(ROOT + ".")]


def package_of(module: str) -> str | None:
    """The top-level package (layer key) of a dotted sglang_omni module name."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def edges() -> list[tuple[str, str, str, str]]:
    """(source module, target module, source package, target package) across packages."""
    result = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        source = module_name(path)
        source_pkg = package_of(source)
        for target in imported_modules(path):
            target_pkg = package_of(target)
            if source_pkg and target_pkg and source_pkg != target_pkg:
                result.append((source, target, source_pkg, target_pkg))
    return result


def upward(edge: tuple[str, str, str, str]) -> bool:
    """True when an edge breaks the layering."""
    _, _, source_pkg, target_pkg = edge
    if source_pkg == "client":
        return target_pkg not in CLIENT_MAY_IMPORT
    if target_pkg == "client":
        return False
    if source_pkg not in LAYER or target_pkg not in LAYER:
        return True
    if (source_pkg, target_pkg) in FORBIDDEN:
        return True
    return LAYER[target_pkg] >= LAYER[source_pkg]


def package_cycles(all_edges: list[tuple[str, str, str, str]]) -> list[list[str]]:
    """Strongly connected groups of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for _, _, source_pkg, target_pkg in all_edges:
        graph.setdefault(source_pkg, set()).add(target_pkg)
        graph.setdefault(target_pkg, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def describe(bad: list[tuple[str, str, str, str]]) -> str:
    return "\n".join(f"  {s} ({sp}) -> {t} ({tp})" for s, t, sp, tp in bad)


def test_every_package_is_layered() -> None:
    assert set(package_of(module_name(p)) for p in PACKAGE_ROOT.rglob("*.py")) - {None} <= (
        set(LAYER) | {"client"}
    ), "a new top-level package needs a layer in LAYER"


def test_no_upward_imports() -> None:
    bad = [edge for edge in edges() if upward(edge)]
    assert not bad, "imports that point up (or sideways) a layer:\n" + describe(bad)


def test_serve_reaches_the_stages_only_through_the_pipeline() -> None:
    """serve/ imports no runtime module (the stage handle above all): a route that called a
    stage itself would bypass the request state and the admission package."""
    reached = sorted(f"{source} -> {target}" for source, target, source_pkg, target_pkg
                     in edges() if source_pkg == "serve" and target_pkg == "runtime")
    assert reached == [], "serve/ imports runtime/ (go through pipeline/): " + ", ".join(reached)


def test_no_package_cycles() -> None:
    all_edges = edges()
    cycles = package_cycles(all_edges)
    lines = []
    for group in cycles:
        members = set(group)
        inner = [e for e in all_edges if e[2] in members and e[3] in members]
        # the edges that close the cycle are those against the layering; show those first
        closing = [e for e in inner if upward(e)] or inner
        lines.append(f"cycle {' <-> '.join(group)}, closed by:\n{describe(closing)}")
    assert not cycles, "\n".join(lines)


def test_scanner_sees_nested_and_relative_imports(tmp_path: Path) -> None:
    """Function-level and relative imports count; importlib strings do not."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "from . import scripted\n"
        "from ..pipeline.umm import Segment\n"
        "def f():\n"
        "    from sglang_omni.serve import app\n"
        "    import sglang_omni.runtime.ipc\n"
        "    return importlib.import_module('sglang_omni.cli')\n"
    )
    assert imported_modules(source, "sglang_omni.engines.probe") == [
        "sglang_omni.engines",
        "sglang_omni.pipeline.umm",
        "sglang_omni.serve",
        "sglang_omni.runtime.ipc",
    ]
    bad = ("sglang_omni.engines.probe", "sglang_omni.serve", "engines", "serve")
    assert upward(bad) and not upward(("x", "y", "serve", "pipeline"))
    assert upward(("x", "y", "serve", "engines")) and upward(("x", "y", "serve", "models"))
    assert not upward(("x", "y", "serve", "contract"))
    assert upward(("x", "y", "client", "serve")) and upward(("x", "y", "media", "config"))
    assert package_cycles([("a", "b", "engines", "serve"), ("c", "d", "serve", "engines")]) == [
        ["engines", "serve"]
    ]


def test_import_string_tables_name_real_classes() -> None:
    """The late-bound tables (the built-in models' pipelines, engines) name real classes; the
    built-in pipelines register themselves, each with the model it serves."""
    from sglang_omni.config.schema import pipeline_class, registered_pipelines
    from sglang_omni.contract.model import ServedModel
    from sglang_omni.engines.base import ENGINES

    builtin = {"Cosmos3UMMPipelineConfig", "Cosmos3PipelineConfig",
               "Cosmos3ReasonerPipelineConfig"}
    assert builtin <= set(registered_pipelines())
    for name in builtin:
        assert pipeline_class(name).__name__ == name
        assert isinstance(pipeline_class(name).model, ServedModel)
    for target in ENGINES.values():
        module, _, cls = target.partition(":")
        path = PACKAGE_ROOT.parent / module.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        defined |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        assert cls in defined, f"{target}: {module} defines no {cls}"
