"""Concurrent interleaved requests: 1, 4, 16 and 64 clients, each request asking for 1 to 8
generations (images and videos mixed by the script), on ``/generate`` and
``/v1/chat/completions``, streaming and not, with ``step_time_s`` 0 and 0.05. Every request gets
exactly one well-formed answer with the segments its script asked for, and 0 fail.

The servers admit up to 128 requests with a one-day deadline (``ROOMY``), above any load used
here even on a loaded machine (the plan is worst-case: 8 generations per active request at the
longest time measured), so a 503 is not expected and counts as a failure.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.reliability.kit import (
    ROOMY,
    SMALL,
    TrackedServer,
    healthy,
    parse_sse,
    script,
    tracked_server,
)
from tests.server import SCRIPTED_UMM

# (clients, requests per client): 116 requests at step_time_s 0, 90 at 0.05.
LOADS = {0.0: [(1, 4), (4, 4), (16, 2), (64, 1)], 0.05: [(1, 2), (4, 2), (16, 1), (64, 1)]}
FORMS = ("generate", "generate-stream", "chat", "chat-stream")


@pytest.fixture(scope="module")
def slow_umm() -> Iterator[TrackedServer]:
    with tracked_server(*SCRIPTED_UMM, *ROOMY, "--generation.factory.step_time_s", "0.05") as srv:
        yield srv


def plan(seed: int) -> tuple[str, list[str], dict[str, Any], str]:
    """(form, media kinds asked for, body, marker text of the final answer) of one request."""
    rng = random.Random(seed)
    kinds = [rng.choice(["image", "video"]) for _ in range(rng.randint(1, 8))]
    marker = f"done-{seed}"
    prompt = script(*[{"action": k, "prompt": f"{k} {seed}.{i}"} for i, k in enumerate(kinds)],
                    {"action": "final", "text": marker})
    form = FORMS[seed % len(FORMS)]
    options = {**SMALL, "num_inference_steps": 1}
    if form.startswith("generate"):
        body: dict[str, Any] = {"prompt": prompt}
    else:
        body = {"messages": [{"role": "user", "content": prompt}]}
    body |= {"stream": form.endswith("stream"), "stage_params": {"generation": options}}
    return form, kinds, body, marker


def media_kinds(segments: list[dict[str, Any]]) -> list[str]:
    return [s["kind"] for s in segments if s["kind"] != "text"]


def check(form: str, kinds: list[str], marker: str, resp: httpx.Response) -> str | None:
    """What is wrong with one answer, or None."""
    if resp.status_code != 200:
        return f"status {resp.status_code}: {resp.text[:300]}"
    if not form.endswith("stream"):
        body = resp.json()
        if form == "generate":
            segments, text = body["segments"], body["text"]
        else:
            message = body["choices"][0]["message"]
            segments, text = message["segments"], message["content"]
        if media_kinds(segments) != kinds or marker not in text:
            return f"wrong answer: {media_kinds(segments)} / {text[:100]!r}, expected {kinds}"
        return None
    try:
        events = parse_sse(resp.text)
    except ValueError as exc:
        return f"undecodable stream ({exc}): {resp.text[-300:]!r}"
    if not events or events[-1][1] != "[DONE]" or [d for _, d in events].count("[DONE]") != 1:
        return f"stream not ended by exactly one [DONE]: {resp.text[-300:]!r}"
    if any(e == "error" or isinstance(d, dict) and "error" in d for e, d in events):
        return f"stream carries an error: {resp.text[-400:]!r}"
    if form == "generate-stream":
        segments = [d for e, d in events if e == "segment"]
        completes = [d for e, d in events if e == "complete"]
        if len(completes) != 1:
            return f"{len(completes)} complete events"
    else:
        chunks = [d for _, d in events[:-1]]
        segments = [c["choices"][0]["delta"]["segment"] for c in chunks
                    if "segment" in c["choices"][0]["delta"]]
        if chunks[-1]["choices"][0]["finish_reason"] is None:
            return "the chat stream has no final chunk with finish_reason"
    indexes = [s["segment_index"] for s in segments]
    if indexes != sorted(indexes) or len(set(indexes)) != len(indexes):
        return f"segments out of order: {indexes}"
    text = "".join(s["data"] for s in segments if s["kind"] == "text")
    if media_kinds(segments) != kinds or marker not in text:
        return f"wrong stream: {media_kinds(segments)} / {text[:100]!r}, expected {kinds}"
    return None


def run_load(server: TrackedServer, clients: int, per_client: int, base: int) -> list[str]:
    """Every failure of ``clients`` concurrent clients sending ``per_client`` requests each."""
    routes = {"generate": "/generate", "chat": "/v1/chat/completions"}

    def client(c: int) -> list[str]:
        problems = []
        with httpx.Client(timeout=120) as http:
            for r in range(per_client):
                seed = base + c * per_client + r
                form, kinds, body, marker = plan(seed)
                try:
                    resp = http.post(server.url + routes[form.split("-")[0]], json=body)
                    problem = check(form, kinds, marker, resp)
                except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
                    problem = f"{exc!r}"
                if problem is not None:
                    problems.append(f"request {seed} ({form}, {len(kinds)} generations): "
                                    f"{problem}")
        return problems

    with ThreadPoolExecutor(clients) as pool:
        return [p for found in pool.map(client, range(clients)) for p in found]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("step_time_s", [0.0, 0.05], ids=["step0", "step0.05"])
def test_every_concurrent_request_gets_one_well_formed_answer(
        step_time_s: float, request: pytest.FixtureRequest) -> None:
    server: TrackedServer = request.getfixturevalue("umm" if step_time_s == 0 else "slow_umm")
    failures: dict[int, list[str]] = {}
    total = 0
    for clients, per_client in LOADS[step_time_s]:
        found = run_load(server, clients, per_client, base=1000 * clients)
        total += clients * per_client
        if found:
            failures[clients] = found
    assert healthy(server.server)
    assert not failures, "\n".join(
        f"{clients} clients: {len(found)} failed, e.g.:\n  " + "\n  ".join(found[:5])
        for clients, found in failures.items()) + f"\n(of {total} requests)"
