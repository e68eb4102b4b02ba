"""The playground in a real browser: Playwright drives the system's chromium (the Debian
``chromium`` package; Playwright's own browser download is never used). Skipped, with the
reason, where either is missing. ``SGL_OMNI_SCREENSHOTS=1`` writes the pages' screenshots to
docs/images/ (the README shows them); otherwise they go to a temporary folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BROWSER_ENV = "SGL_OMNI_CHROMIUM"
IMAGES = Path(__file__).parents[2] / "docs" / "images"


def chromium() -> str | None:
    """The chromium executable: ``$SGL_OMNI_CHROMIUM``, else chromium on the PATH."""
    return os.environ.get(BROWSER_ENV) or shutil.which("chromium") \
        or shutil.which("chromium-browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium for one test module. Not session-wide: Playwright's sync API keeps an
    event loop running in this thread until it stops, and every later test on the same worker
    that calls ``asyncio.run`` would fail."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (the dev extra)")
    executable = chromium()
    if executable is None:
        pytest.skip("no chromium: apt-get install -y chromium (or set SGL_OMNI_CHROMIUM)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable,
                                              args=["--no-sandbox"], headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  accept_downloads=True)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.page_errors = errors
    yield opened
    context.close()
    assert errors == [], errors


@pytest.fixture
def screenshot(tmp_path: Path) -> Any:
    """``screenshot(page, name)``: docs/images/<name>.png with SGL_OMNI_SCREENSHOTS=1."""
    folder = IMAGES if os.environ.get("SGL_OMNI_SCREENSHOTS") == "1" else tmp_path

    def take(page: Any, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path))
        return path

    return take
