"""The plan offers no more generations than ``max_dispatches`` can run (over HTTP, scripted
engines): each generation takes a Reasoner turn and a dispatch, and a last turn answers, so the
demo's ``max_dispatches`` 3 allows one. ``GET /v1/queue`` said "allowance 7" after one was
used (the plan counted the pipeline's 8), and the playground's queue panel with it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kit import script
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import HTTP, final, image

SLOW = {"generation": {"width": 32, "height": 32, "num_inference_steps": 200}}


@pytest.fixture(scope="module")
def demo_bounds() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, "--orchestrator.factory.max_dispatches", "3",
                "--generation.factory.step_time_s", "0.1") as server:
        yield server


def plan_once_generating(server: Server, prompt: str) -> dict[str, Any]:
    """The request's row of ``/v1/queue`` once its first generation reported a step."""
    body = {"prompt": prompt, "stream": True, "include_progress": True, "stage_params": SLOW}
    with HTTP.stream("POST", f"{server.url}/generate", json=body) as resp:
        assert resp.status_code == 200
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "progress":
                data = json.loads(line[5:])
                if data.get("stage") == "generation" and data.get("step"):
                    (row,) = HTTP.get(f"{server.url}/v1/queue").json()["plan"]
                    return dict(row)
    raise AssertionError("the generation reported no step")


def test_the_queue_counts_what_max_dispatches_allows(demo_bounds: Server) -> None:
    row = plan_once_generating(demo_bounds, script(image("a slow cube"), final("done")))
    assert (row["used"], row["allowance"]) == (1, 0)

