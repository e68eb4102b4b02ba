"""Every curl the README and docs show is quiet (``-s``): pasted into a terminal, it prints the
answer and no progress meter over it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
#: A curl command: at the start of a line or after a shell separator or "try:".
CURL = re.compile(r"(?:^|[;&|(]\s*|try: )curl (.*)$", re.M)


def is_silent(args: str) -> bool:
    """Whether curl's arguments (its options come before any quoted body) ask for silence."""
    for word in re.split(r"['\"]", args, maxsplit=1)[0].split():
        if word == "--silent" or (word.startswith("-") and not word.startswith("--")
                                   and "s" in word[1:]):
            return True
    return False


def documented_curls() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            start = text.count("\n", 0, block.start()) + 1
            for match in CURL.finditer(block[2]):
                line = start + block[2].count("\n", 0, match.start()) + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match[1]))
    return found


def test_every_documented_curl_is_silent() -> None:
    curls = documented_curls()
    assert len(curls) > 20  # the pages' curls were found
    loud = [where for where, args in curls if not is_silent(args)]
    assert not loud, f"curl without -s at {loud}"
