"""``--demo`` serves its model as ``cosmos3`` (the README's recipes name it so), not under the
cache path of its tiny checkpoint; ``--model-name`` still names another."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytest.importorskip("diffusers")

from tests.server import Server  # noqa: E402


def test_the_text_only_demo_serves_cosmos3(tiny_checkpoint: Path) -> None:
    with Server("--demo", "--text-only", "--model-path", str(tiny_checkpoint),
                timeout=240) as server:
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["cosmos3"]
        resp = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "model": "cosmos3", "max_tokens": 4,
            "messages": [{"role": "user", "content": "What is in a red cube?"}]})
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == "cosmos3"

