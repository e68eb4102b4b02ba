"""The reference pages are generated from the code (docs/configuration.md from the config schema
and the argument parser, docs/http-api.md from the OpenAPI schemas) and the Grafana dashboard
plots the documented metrics, so none of them can drift."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.metrics.kit import SCALING_OUT, table

ROOT = Path(__file__).parents[2]


def test_generated_pages_match_the_code() -> None:
    done = subprocess.run([sys.executable, "scripts/reference_docs.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_configuration_page_names_every_key_and_flag() -> None:
    from sglang_omni import cli
    from sglang_omni.config.server import KEYS

    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in KEYS:
        assert f"| `{key}` |" in text, key
    serve = next(a for a in cli.build_parser()._actions if hasattr(a, "choices")
                 and isinstance(a.choices, dict)).choices["serve"]
    for action in serve._actions:
        for flag in action.option_strings if action.dest != "help" else ():
            assert f"`{flag}`" in text, flag


def test_the_grafana_dashboard_plots_every_documented_metric() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"sgl_omni_[a-z_]+", e)}
    documented = set(table()) | set(table(SCALING_OUT))  # one server's, a fleet gateway's
    assert any(m.startswith("sgl_omni_gateway_") for m in documented)
    base = {re.sub(r"_(bucket|sum|count)$", "", m) for m in used}
    assert base <= documented, base - documented
    assert documented <= base, documented - base


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_and_anchors_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.name}: {target}")
                continue
            if anchor and path.suffix == ".md":
                headings = re.findall(r"(?m)^#+ (.*)$", path.read_text())
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_first_screen_is_short_and_shows_the_way_in() -> None:
    readme = (ROOT / "README.md").read_text()
    headings = [m.start() for m in re.finditer(r"(?m)^## ", readme)]
    first_screen = readme[:headings[1]]
    assert first_screen.count("\n") < 60
    assert "![" in first_screen and "docs/images/playground-interleaved.png" in first_screen
    assert "make demo" in first_screen and "make test" in first_screen
    assert "curl -sN http://127.0.0.1:8000/generate" in first_screen
    assert (ROOT / "docs" / "images" / "playground-interleaved.png").is_file()
    for image in re.findall(r"\(((?:docs/)?images/[^)]+\.png)\)", readme):
        assert (ROOT / image).is_file(), image
