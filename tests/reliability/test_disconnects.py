"""A client that leaves a stream is not an error: 100 streams of ``/generate`` and the chat
route, each left after its Nth SSE event (N drawn with a fixed seed, 0 = once the headers came;
with and without progress events), leave no ERROR and no traceback in the server's log, one
INFO line per request with its rid (``status=499``), and every request state released.

Each left mid-generation used to log "a request's stream failed as it was closed ...
RuntimeError: aclose(): asynchronous generator is already running" twice: the keep-alive
reader returned while the read it had cancelled was still running the inner stream."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.kit import no_request_states
from tests.reliability.kit import SMALL, TrackedServer, script

STREAMS = 100
CLIENTS = 8
SEED = 33
GEN = {"generation": {**SMALL, "num_inference_steps": 2}}
# Reasoner turns and generations of several lengths: a client may leave in any of them.
PROMPT = script({"action": "image", "prompt": "a", "delay_s": 0.05},
                {"action": "image", "prompt": "!sleep=0.1 b"},
                {"action": "video", "prompt": "c"},
                {"action": "final", "text": "late", "delay_s": 0.1})


def request_of(i: int) -> tuple[str, dict]:
    """The i-th stream's route and body: /generate with and without progress, the chat route."""
    if i % 3 == 0:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                        "stage_params": GEN, "stream": True,
                                        "stream_options": {"include_progress": i % 2 == 0}}
    return "/generate", {"prompt": PROMPT, "stage_params": GEN, "stream": True,
                         "include_progress": i % 3 == 1}


def leave_after(http: httpx.Client, url: str, i: int, events: int) -> str | None:
    """Stream request ``i`` and close the connection after its ``events``-th SSE event; what
    went wrong, if anything (the stream ending first is fine: it was short)."""
    route, body = request_of(i)
    with http.stream("POST", url + route, json=body) as resp:
        if resp.status_code != 200:
            return f"{route}: {resp.status_code} {resp.read()[:200]!r}"
        seen = 0
        for line in resp.iter_lines():
            if seen >= events:
                break
            if line.startswith("data:"):
                seen += 1
    return None  # leaving the block closes the connection mid-stream


@pytest.mark.timeout(240)
def test_clients_that_leave_streams_log_no_error(umm: TrackedServer) -> None:
    rng = random.Random(SEED)
    plan = [(i, rng.randrange(0, 8)) for i in range(STREAMS)]
    start = len(umm.server.log())

    def client(c: int) -> list[str]:
        with httpx.Client(timeout=60) as http:
            found = (leave_after(http, umm.url, i, n) for i, n in plan[c::CLIENTS])
            return [p for p in found if p]

    with ThreadPoolExecutor(CLIENTS) as pool:
        problems = [p for found in pool.map(client, range(CLIENTS)) for p in found]
    assert problems == [], problems[:5]
    assert no_request_states(umm.server, timeout=30) is None  # every abort was released
    log = umm.server.log()[start:]
    bad = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert bad == [], "\n".join(bad[:10])
    left = [line for line in log.splitlines() if "sglang_omni.access" in line
            and "status=499" in line and "rid=" in line]
    assert len(left) >= STREAMS // 2, f"only {len(left)} requests logged as left (499)"
