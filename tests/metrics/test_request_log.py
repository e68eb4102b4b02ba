"""One log line per request (request id, route, turns, generations, bytes, duration, outcome),
as text by default and as JSON with ``--log-format json``."""

from __future__ import annotations

import json

import httpx

from tests.kit import script, wait_until
from tests.server import SCRIPTED_UMM, Server
from tests.umm.kit import SMALL, final, image

BODY = {"prompt": script(image("a cube"), final("done")), "stage_params": {"generation": SMALL}}


def test_text_lines() -> None:
    with Server(*SCRIPTED_UMM) as server:
        assert httpx.post(f"{server.url}/generate", json={**BODY, "rid": "log-text-1"},
                          timeout=30).status_code == 200
        with httpx.stream("POST", f"{server.url}/generate", timeout=30, json={
                "prompt": script(image("!no-media")), "rid": "log-text-2", "stream": True,
                "stage_params": {"generation": SMALL}}) as resp:
            resp.read()
        httpx.get(f"{server.url}/health")
        assert wait_until(lambda: "rid=log-text-2" in server.log(), timeout=5)
        log = server.log()
    ok = next(line for line in log.splitlines() if "rid=log-text-1" in line)
    assert "sglang_omni.access: request rid=log-text-1 method=POST route=/generate status=200 " \
           "outcome=ok turns=2 generations=1 segments=2 bytes=" in ok
    assert " duration_s=" in ok and " first_segment_s=" in ok
    failed = next(line for line in log.splitlines() if "rid=log-text-2" in line)
    assert "status=500 outcome=failed turns=1 generations=1 segments=0" in failed
    assert "route=/health" not in log  # monitors' polls are not logged


def test_json_lines() -> None:
    with Server(*SCRIPTED_UMM, "--log-format", "json") as server:
        resp = httpx.post(f"{server.url}/generate", json={**BODY, "rid": "log-json-1"},
                          timeout=30)
        assert resp.status_code == 200
        bad = httpx.post(f"{server.url}/generate", json={"prompt": "x", "temperature": "hot"})
        assert bad.status_code == 400
        assert wait_until(lambda: '"status": 400' in server.log(), timeout=5)
        log = server.log()
    records = [json.loads(line) for line in log.splitlines() if line]  # stages' lines too
    assert {r["stage"] for r in records if "stage" in r} == {"reasoner", "generation"}
    requests = [r for r in records if r["logger"] == "sglang_omni.access"]
    ok = next(r for r in requests if r["rid"] == "log-json-1")
    assert ok["route"] == "/generate" and ok["status"] == 200 and ok["outcome"] == "ok"
    assert ok["turns"] == 2 and ok["generations"] == 1 and ok["segments"] == 2
    assert ok["bytes"] == len(resp.content) and ok["duration_s"] > 0
    assert ok["level"] == "INFO" and ok["ts"].endswith("+00:00")
    refused = next(r for r in requests if r["status"] == 400)
    assert refused["outcome"] == "refused" and refused["route"] == "/generate"
    assert refused["rid"] is None and refused["turns"] is None  # refused before it had an id
    assert any(r["logger"] == "sglang_omni.runtime" and "all stages ready" in r["message"]
               for r in records)
    ready = [r for r in records if r.get("event") == "ready"]  # the ready line, as JSON too
    assert len(ready) == 1 and ready[0]["playground"] == f"{server.url}/"
