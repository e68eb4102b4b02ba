"""One figure per fact: how long ``make test`` takes is stated once, in docs/development.md
(``#test-time``), and the README and the Makefile link there instead of stating it again (three
pages once gave three different times)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
HOME = ROOT / "docs" / "development.md"
ANCHOR = "development.md#test-time"
#: Where a newcomer reads about the tests.
PAGES = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run",
         *sorted((ROOT / "docs").glob("*.md"))]
#: A duration in minutes ("13 minutes", "6.5 min", "13 to 14 minutes", "9 min 43 s").
DURATION = re.compile(r"\b\d+(?:\.\d+)?(?:\s*(?:to|-|–)\s*\d+(?:\.\d+)?)?\s*(?:min|mins|minutes)\b")
#: What names the whole suite.
SUITE = re.compile(r"make test\b|test suite|the suite|whole suite", re.I)


def sentences(text: str) -> list[str]:
    """Sentences (comment markers and line breaks removed), split at a full stop that ends one."""
    flat = re.sub(r"\s*\n\s*#?\s*", " ", text)
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(*\[<])|\n\s*\n", flat)


def statements() -> list[tuple[str, str]]:
    """Every (page, sentence) that names the whole suite and a duration in minutes."""
    found = []
    for page in PAGES:
        for sentence in sentences(page.read_text()):
            if SUITE.search(sentence) and DURATION.search(sentence):
                found.append((str(page.relative_to(ROOT)), sentence.strip()))
    return found


def test_the_test_time_is_stated_once_in_its_home() -> None:
    found = statements()
    assert [page for page, _ in found] == ["docs/development.md"], found
    assert "\n### Test time\n" in HOME.read_text()  # the anchor the others link to


def test_the_readme_and_the_makefile_link_to_it() -> None:
    for page in ("README.md", "Makefile"):
        assert ANCHOR in (ROOT / page).read_text(), page


def test_a_second_statement_is_found() -> None:
    """The check reads the shapes the pages used (so it can fail)."""
    for text in ("Run the whole test suite (about 13 minutes on two cores):",
                 "# ran the suite in 6.5 min instead of 7.5 on the 2-core\n# CI machine.",
                 "`make test` took 9 min 43 s."):
        assert any(SUITE.search(s) and DURATION.search(s) for s in sentences(text)), text
