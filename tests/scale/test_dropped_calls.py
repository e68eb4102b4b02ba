"""What a replica deletes for a call its gateway abandoned, and how long a fleet read may still
wait for the replicas (pure code)."""

from __future__ import annotations

import json
import time

from sglang_omni.scale.dropped_calls import makes_held_result, undo_request
from sglang_omni.scale.fleet_answers import MIN_WAIT_S, REPLY_S, replica_wait

POST = {"method": "POST", "path": "/v1/videos", "query_string": b"x=1",
        "headers": [(b"authorization", b"Bearer k")], "body": b"{}"}


def answer(status: int, body: object) -> list[dict[str, object]]:
    return [{"type": "http.response.start", "status": status, "headers": []},
            {"type": "http.response.body", "body": json.dumps(body).encode()}]


def test_a_video_job_made_for_an_abandoned_call_is_deleted_with_the_callers_headers() -> None:
    assert makes_held_result(POST) and makes_held_result({**POST, "path": "/v1/videos/"})
    undo = undo_request(POST, answer(200, {"id": "video_1", "status": "queued"}))
    assert undo is not None
    assert (undo["method"], undo["path"], undo["body"], undo["query_string"]) == (
        "DELETE", "/v1/videos/video_1", b"", b"")
    assert undo["headers"] == POST["headers"]  # an API key applies to the delete too


def test_nothing_is_deleted_for_an_error_or_another_route() -> None:
    assert undo_request(POST, answer(503, {"error": {"message": "busy"}})) is None
    assert undo_request(POST, answer(200, ["no id"])) is None
    generate = {**POST, "path": "/generate"}
    assert not makes_held_result(generate) and undo_request(generate, answer(200, {})) is None


def test_a_fleet_read_waits_for_the_replicas_only_within_its_whole_bound() -> None:
    now = time.monotonic()
    assert abs(replica_wait(1.5, now) - (1.5 - REPLY_S)) < 0.05
    assert abs(replica_wait(1.5, now - 1.0) - (0.5 - REPLY_S)) < 0.05
    assert replica_wait(1.5, now - 5.0) == MIN_WAIT_S
