"""One log line per request (request id, route, turns, generations, bytes, duration, outcome),
as text by default and as JSON with ``--log-format json``."""

from __future__ import annotations

import json

import httpx

from tests.kit import script, wait_until
from tests.metrics.kit import Scrape
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


POLLS = ("/health", "/v1/queue", "/metrics", "/playground/assets/app.js",
         "/docs/assets/swagger-ui.css", "/health?probe=1")


def _poll_then_mark(server: Server, mark: str) -> str:
    """Poll every poll path, then send a logged request; the log once its line is in."""
    for path in POLLS:
        assert httpx.get(f"{server.url}{path}", timeout=10).status_code == 200, path
    httpx.get(f"{server.url}/v1/models", params={"mark": mark}, timeout=10)
    assert wait_until(lambda: "route=/v1/models" in server.log(), timeout=5)
    return server.log()


def test_polls_are_not_logged_by_omni_or_uvicorn() -> None:
    with Server(*SCRIPTED_UMM) as server:
        _poll_then_mark(server, "quiet")
        for route in ("/openapi.json", "/docs", "/redoc"):
            assert httpx.get(f"{server.url}{route}", timeout=10).status_code == 200
        assert wait_until(lambda: "route=/redoc" in server.log(), timeout=5)
        log = server.log()
        scrape = Scrape(server)
    assert '"GET /v1/models?mark=quiet HTTP/1.1" 200' in log  # uvicorn's access log is on
    for path in POLLS:
        assert f"GET {path} " not in log and f"route={path} " not in log, path
    # the API docs have route labels of their own, in the log and the metrics
    for route in ("/openapi.json", "/docs", "/redoc"):
        assert f"route={route} status=200 outcome=ok" in log
        assert scrape.value("sgl_omni_requests_total", route=route, status="200") == 1
    assert "route=unmatched" not in log
    # polls are still counted
    assert scrape.value("sgl_omni_requests_total", route="/v1/queue", status="200") == 1


def test_log_polls_logs_them() -> None:
    with Server(*SCRIPTED_UMM, "--log-polls") as server:
        log = _poll_then_mark(server, "loud")
    for path in ("/health", "/v1/queue", "/metrics"):
        assert f"route={path} status=200" in log, path
        assert f'"GET {path} HTTP/1.1" 200' in log, path
    assert "route=/playground/assets/{name} status=200" in log
