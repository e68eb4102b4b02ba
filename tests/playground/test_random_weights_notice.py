"""The playground says when the served checkpoint's weights are random, in chromium: a server
whose ``model_path`` holds the builder's random-weight note shows it above the page; a server
without one shows nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sglang_omni.config import random_weights
from tests.server import SCRIPTED_UMM, Server

BUILT_BY = "sgl-omni make-checkpoint --shape tiny --seed 3"


@pytest.fixture(scope="module")
def random_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The scripted engines (they load no weights) on a checkpoint folder holding the note a
    checkpoint builder writes."""
    checkpoint = tmp_path_factory.mktemp("random-checkpoint")
    random_weights.record(checkpoint, BUILT_BY)
    with Server(*SCRIPTED_UMM, "--model-path", str(checkpoint),
                "--model-name", "cosmos3") as server:
        yield server


def open_page(page: Any, server: Server) -> None:
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready]")


def test_a_random_weight_checkpoint_is_announced_on_the_page(page: Any,
                                                             random_server: Server) -> None:
    info = httpx.get(f"{random_server.url}/server_info").json()
    assert info["random_weights"] is True and BUILT_BY in info["notice"]
    open_page(page, random_server)
    assert page.is_visible("#weights-notice")
    shown = page.inner_text("#weights-notice")
    assert shown.startswith("Random weights: images are noise and answers are gibberish")
    assert BUILT_BY in shown
    box = page.locator("#weights-notice").bounding_box()
    assert box is not None and box["y"] < 200 and box["height"] > 10  # at the top, in view


def test_a_trained_checkpoint_shows_no_notice(page: Any) -> None:
    with Server(*SCRIPTED_UMM, "--model-name", "cosmos3") as server:
        assert httpx.get(f"{server.url}/server_info").json()["random_weights"] is False
        open_page(page, server)
        assert not page.is_visible("#weights-notice")
        assert page.inner_text("#weights-notice") == ""
