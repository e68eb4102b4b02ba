"""The HTTP layer writes no private field of another object (Starlette's ``request._body`` and
``_json`` were written once): a library's private field can change meaning in any release, and
``OmniRoute`` hands FastAPI the body it read through a ``Request`` subclass instead. Only a
class's own ``self._x``/``cls._x`` is set."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "sglang_omni" / "serve"


def test_serve_sets_no_private_field_of_another_object() -> None:
    found = []
    for path in sorted(SERVE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if (isinstance(target, ast.Attribute) and target.attr.startswith("_")
                        and not (isinstance(target.value, ast.Name)
                                 and target.value.id in ("self", "cls"))):
                    found.append(f"{path.name}:{node.lineno} sets {ast.unparse(target)}")
    assert not found, "\n".join(found)
