"""The direct routes' media count against the server's client media budget, over HTTP.

The generation stage reads an edit's image, a video job's ``input_reference`` (its
``image_path``) and an action's observation itself, from an allowed local folder here: each
request reserves the most they may take (a local file: the one-file limit, at most
``max_media_bytes``) from its admission until its generation ends (a video job: until the job
ends, after its answer), with the same 503 and Retry-After as the chat routes, and the same
``sgl_omni_client_media_bytes`` gauge. Before, these reads counted nowhere.

The server: ``--server.max_media_bytes 4096`` (a local reference reserves 4096 bytes) and
``--server.max_client_media_bytes 6000`` (one such request fits, two do not); each denoising
step takes 0.5 s, so a 200-step video job runs until the test deletes it. Every step syncs on
the gauge or the answers, never on time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.generation.kit import (
    CAT_PNG,
    HTTP,
    cat_media_root,
    error_of,
    metric,
    scripted_server,
    wait_for,
)
from tests.server import Server

PNG = CAT_PNG
RESERVED = 4096
BUDGET = 6000
DROID = {"domain_name": "droid_lerobot", "raw_action_dim": 8}


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cat_media_root(tmp_path_factory)


@pytest.fixture(scope="module")
def server(media_root: Path) -> Iterator[Server]:
    with scripted_server("--generation.factory.step_time_s", "0.5",
                         "--server.max_media_bytes", str(RESERVED),
                         "--server.max_client_media_bytes", str(BUDGET),
                         "--allowed-local-media-path", str(media_root)) as srv:
        yield srv


def held(server: Server) -> float:
    for line in HTTP.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("sgl_omni_client_media_bytes "):
            return float(line.split()[1])
    raise AssertionError("no sgl_omni_client_media_bytes gauge in /metrics")


def over_budget(server: Server, route: str, payload: dict) -> None:
    """``payload`` to ``route`` is refused with 503 and Retry-After naming the budget, before
    the stage sees it."""
    submitted = metric(server, "submitted")
    resp = HTTP.post(f"{server.url}{route}", json=payload)
    assert resp.status_code == 503, resp.text
    assert resp.headers.get("retry-after")
    assert "--server.max_client_media_bytes" in str(error_of(resp)["message"])
    assert metric(server, "submitted") == submitted


def test_local_media_of_direct_routes_count_against_the_budget(server: Server,
                                                               media_root: Path) -> None:
    cat = str(media_root / "cat.png")
    assert held(server) == 0
    job = HTTP.post(f"{server.url}/v1/videos", json={
        "prompt": "animate", "input_reference": cat, "width": 16, "height": 16,
        "num_frames": 2, "num_inference_steps": 200})
    assert job.status_code == 200, job.text
    try:
        assert held(server) == RESERVED  # reserved before the stage reads it
        over_budget(server, "/v1/images/edits", {"prompt": "cat", "url": [cat], "size": "8x8",
                                                 "num_inference_steps": 1})
        over_budget(server, "/v1/actions/generations", {
            "input": {"task": "t", "image_path": cat}, "parameters": DROID})
        over_budget(server, "/v1/videos", {"prompt": "again", "input_reference": cat,
                                           "width": 16, "height": 16, "num_frames": 2})
        assert 'sgl_omni_admission_refusals_total{reason="media_budget"} 3.0' in HTTP.get(
            f"{server.url}/metrics").text
    finally:
        HTTP.delete(f"{server.url}/v1/videos/{job.json()['id']}")
    wait_for(lambda: held(server) == 0, timeout=60)  # the job ended: its media with it
    edit = HTTP.post(f"{server.url}/v1/images/edits", json={
        "prompt": "cat", "url": [cat], "size": "8x8", "num_inference_steps": 1})
    assert edit.status_code == 200, edit.text
    assert held(server) == 0  # released as its generation ended, before the answer
    action = HTTP.post(f"{server.url}/v1/actions/generations", json={
        "input": {"task": "t", "image_path": cat}, "parameters": {**DROID,
                                                                  "num_inference_steps": 1}})
    assert action.status_code == 200, action.text
    assert held(server) == 0
