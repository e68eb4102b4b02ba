"""``GET /server_info`` says what each figure is (over HTTP, scripted engines): ``version`` is
the native SGLang release whose routes this server follows, ``native_sglang`` tells it from
what is installed, ``engines``/``scripted`` say when no model runs, and the random-weight
notice of a text-only server speaks of answers only (it makes no image)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx
import pytest

from sglang_omni.config import random_weights
from tests.server import SCRIPTED_CHAT, SCRIPTED_UMM, Server

BUILT_BY = "sgl-omni make-checkpoint --shape tiny --seed 3"


def installed_sglang() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def random_chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint: Path = tmp_path_factory.mktemp("random-checkpoint")
    random_weights.record(checkpoint, BUILT_BY)
    with Server(*SCRIPTED_CHAT, "--model-path", str(checkpoint)) as server:
        yield server


def test_the_versions_say_what_they_are(random_chat: Server) -> None:
    info = httpx.get(f"{random_chat.url}/server_info", timeout=10).json()
    assert info["version"] == "0.5.23"  # kept: a gateway reads it as native's
    assert info["native_sglang"] == {"follows": "0.5.23", "installed": installed_sglang()}
    assert isinstance(info["omni_version"], str) and info["omni_version"]


def test_a_text_only_random_checkpoint_says_nothing_of_images(random_chat: Server) -> None:
    info = httpx.get(f"{random_chat.url}/server_info", timeout=10).json()
    assert info["random_weights"] is True
    assert info["notice"].startswith("random weights: answers are gibberish, but the Reasoner "
                                     "runs the real model code")
    assert BUILT_BY in info["notice"]
    ready = next(line for line in random_chat.log().splitlines() if "ready in" in line)
    assert "answers are gibberish" in ready and "image" not in ready.split("curl")[0]


def test_the_scripted_engines_are_named() -> None:
    with Server(*SCRIPTED_UMM) as server:
        info = httpx.get(f"{server.url}/server_info", timeout=10).json()
    assert info["engines"] == {"generation": "scripted", "reasoner": "scripted"}
    assert info["scripted"] is True
    assert info["scripted_notice"].startswith("scripted engines (generation, reasoner), no model")
    assert "<omni-script>" in info["scripted_notice"]
    assert info["random_weights"] is False and info["notice"] is None
