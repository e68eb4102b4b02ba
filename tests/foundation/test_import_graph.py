"""Package layering: imports point one way and packages form no cycle.

Layers, lowest first: errors, aio -> media, config, client -> contract -> engines -> runtime ->
pipeline -> models -> serve -> scale -> cli (scale, the Ray Serve deployment, runs whole servers:
only the CLI sits above it). A module may import its own package or any lower layer. media,
config and client share one level and may not import each other, nor may errors and aio (neither
needs the other; keeping them apart keeps both leaves of the graph). contract, the stage contract
(jobs, results, payloads, generation options, the engine and model interfaces), sits just above
them so that every layer may import it. client, the Python SDK, sits just above errors: it may
import errors and its own modules only (not even aio), and every layer above it sees it as any
lower layer (no import of it is exempt).

Some edges that point down are forbidden too (``FORBIDDEN``): serve, the HTTP layer, imports no
engine and no model package; it reaches the configured model through the ``contract.model``
interface its pipeline config names (``PipelineConfig.model``), so a model package added
without a change to serve serves through the same routes. Nor does serve import anything in
runtime (the stage handle, its IPC, the process helpers): pipeline is the only door to the
stages, for every mode (the orchestrator and ``pipeline.direct``), so every request holds a
request state and takes its admission ticket from ``pipeline.admission``.

Every ``import`` and ``from ... import`` counts, including those inside functions, and so does a
literal module name passed to ``importlib.import_module``. A module imported by a name the code
does not spell out would hide its edge: only the model loader (``config/model_imports.py``: the
``sglang_omni.models`` entry points and the config's ``model_packages``) may do that
(``test_no_import_by_computed_name``), and the entry points it loads point into models/
(``test_model_entry_points_point_into_models``).
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
    "client": 1,
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
        elif (named := imported_by_call(node)) is not None and named[1] is not None:
            found.append(named[1])
    return [name for name in found if name == ROOT or name.startswith(ROOT + ".")]


#: The calls that import a module named by their first argument.
IMPORT_CALLS = {"import_module", "__import__"}


def imported_by_call(node: ast.AST) -> tuple[ast.Call, str | None] | None:
    """For a call of ``importlib.import_module`` or ``__import__``: the call and the module it
    names when that is a string literal (None: a name the code computes); None for any other
    node."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in IMPORT_CALLS:
        return None
    first = node.args[0] if node.args else None
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return node, first.value
    return node, None


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
        set(LAYER)
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
    """Function-level and relative imports count, and so do literal importlib names."""
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
        "sglang_omni.cli",
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
    built-in pipelines register themselves, each with the model it serves (a ``ServedModel``,
    which implements the config's ``ModelProtocol``)."""
    from sglang_omni.config.model_protocols import ModelProtocol
    from sglang_omni.config.schema import pipeline_class, registered_pipelines
    from sglang_omni.contract.model import ServedModel
    from sglang_omni.engines.base import ENGINES

    builtin = {"Cosmos3UMMPipelineConfig", "Cosmos3PipelineConfig",
               "Cosmos3ReasonerPipelineConfig"}
    assert builtin <= set(registered_pipelines())
    for name in builtin:
        assert pipeline_class(name).__name__ == name
        assert isinstance(pipeline_class(name).model, ServedModel)
        assert isinstance(pipeline_class(name).model, ModelProtocol)
    base = PACKAGE_ROOT / "engines" / "base.py"
    tree = ast.parse(base.read_text())
    factories = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for factory in ENGINES.values():
        node = factories[factory.__name__]
        [imported] = [n for n in ast.walk(node) if isinstance(n, ast.ImportFrom)]
        module, [alias] = imported.module or "", imported.names
        path = PACKAGE_ROOT.parent / module.replace(".", "/")
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        defined |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        assert alias.name in defined, f"{factory.__name__}: {module} defines no {alias.name}"


# --- item: nothing imported by a computed name hides an edge; models import no engine ---------
#: The one module that imports code by a name it does not spell out (entry points, the config's
#: ``model_packages``, the diffusion driver a test names).
MODEL_LOADER = PACKAGE_ROOT / "config" / "model_imports.py"


def computed_imports(path: Path) -> list[int]:
    """The lines of ``path`` that import a module by a name the code computes."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [found[0].lineno for node in ast.walk(tree)
            if (found := imported_by_call(node)) is not None and found[1] is None]


def test_no_import_by_computed_name() -> None:
    """An import string would hide its edge from this test (the scripted engine's adapter and
    the config's models package once did): outside the model loader every module is imported
    by a literal name."""
    bad = [f"  {path.relative_to(PACKAGE_ROOT.parent)}:{line}"
           for path in sorted(PACKAGE_ROOT.rglob("*.py")) if path != MODEL_LOADER
           for line in computed_imports(path)]
    assert not bad, ("modules imported by a computed name (import them by a literal name, or "
                     "load them through config.model_imports):\n" + "\n".join(bad))
    assert computed_imports(MODEL_LOADER), "the model loader moved: update MODEL_LOADER"


def test_computed_import_scan_sees_both_spellings(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text("import importlib\nname = 'x'\nimportlib.import_module(name)\n"
                      "__import__(name + 'y')\nimportlib.import_module('sglang_omni.cli')\n")
    assert computed_imports(source) == [3, 4]


def test_models_import_no_engine() -> None:
    """A model package reaches engines only through the contract (its options, its Protocols):
    what an engine needs of a model it gets through ``config.model_protocols`` and the config."""
    bad = [edge for edge in edges() if edge[2] == "models" and edge[3] == "engines"]
    assert not bad, "models/ imports engines:\n" + describe(bad)


def test_model_entry_points_point_into_models() -> None:
    """pyproject.toml's ``sglang_omni.models`` entry points are the loader's only edges: each
    names a module under models/, and the built-in one is the loader's fallback (loaded even
    where the installed metadata predates it)."""
    import tomllib

    from sglang_omni.config.model_imports import BUILT_IN, GROUP

    project = tomllib.loads((PACKAGE_ROOT.parent / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][GROUP]
    assert declared == {BUILT_IN.name: BUILT_IN.value}
    for value in declared.values():
        assert package_of(value.partition(":")[0]) == "models", value


def test_client_has_a_layer_and_no_exemption() -> None:
    """client/ (the Python SDK) sits beside media and config, just above errors: no import of
    it or by it is exempt from the layer rules."""
    assert LAYER["client"] == LAYER["config"] == LAYER["errors"] + 1
    assert not upward(("x", "y", "client", "errors"))
    assert upward(("x", "y", "client", "aio"))  # the SDK imports errors and itself only
    assert upward(("x", "y", "media", "client")) and upward(("x", "y", "config", "client"))
    assert not upward(("x", "y", "cli", "client"))
