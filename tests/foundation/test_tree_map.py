"""docs/development.md's map ("Where a change goes") names every folder of ``sglang_omni/`` and
every folder it names exists: the map a newcomer reads matches the tree."""

from __future__ import annotations

import re
from pathlib import Path

import sglang_omni

PACKAGE = Path(sglang_omni.__file__).parent
DOC = PACKAGE.parent / "docs" / "development.md"


def map_rows() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Where a change goes: the map", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def named_in_map() -> set[str]:
    """Top-level folders and modules the map's first column names, and the subfolders
    (``stage/``, ``admission/``, ``hf/`` ...) its second column names."""
    names: set[str] = set()
    for row in map_rows():
        first, second = row.split("|")[1:3]
        names.update(n.rstrip("/") for n in re.findall(r"`([\w.]+/?)`", first))
        names.update(n.rstrip("/") for n in re.findall(r"`(\w+)/`", second))
    return names


def packages(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


TOP = packages(PACKAGE)
#: Subfolders of every package but serve/ (the HTTP layer's folders have their own table).
SUB = {name for top in TOP - {"serve"} for name in packages(PACKAGE / top)}
SERVE_FOLDERS = packages(PACKAGE / "serve")


def test_the_map_names_every_package_folder() -> None:
    named = named_in_map()
    assert TOP - named == set(), "add these folders to docs/development.md's map"
    assert SUB - named == set(), "name these subfolders in docs/development.md's map"


def test_every_folder_the_map_names_exists() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.glob("*.py")}
    missing = named_in_map() - TOP - SUB - modules
    assert missing == set(), "docs/development.md's map names folders the tree does not have"


def test_the_http_folders_table_names_every_serve_folder() -> None:
    text = DOC.read_text()
    section = text.split("## The HTTP layer's folders", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `(\w+)/` \|", section, re.M))
    assert SERVE_FOLDERS <= named, SERVE_FOLDERS - named
    assert named <= SERVE_FOLDERS, named - SERVE_FOLDERS
