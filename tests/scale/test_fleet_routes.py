"""Through Ray's HTTP proxy, a fleet of two replicas answers every route of the interleaved
pipeline exactly as one server does: statuses, content types, bodies, error bodies and streams
(segments byte-identical for the same request ids and seeds). Each replica asks Ray for the two
(simulated) GPUs its stages use and places its stages on them; the replicas land on both nodes
and requests spread across them."""

from __future__ import annotations

import concurrent.futures
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")

from tests.kit import parse_sse, script  # noqa: E402
from tests.scale.kit import (  # noqa: E402
    ON_GPUS,
    Fleet,
    RayCluster,
    deploy,
    gateway_metric,
    settle,
    whole_read,
)
from tests.server import SCRIPTED_UMM, Server  # noqa: E402
from tests.wire.kit import (  # noqa: E402
    connect,
    read_until_closed,
    refused_beside_upload,
    refused_prompt,
    status_within,
)

COMMON = ("--generation.factory.step_time_s", "0.02", "--server.max_body_bytes", "65536",
          "--server.max_pending_body_bytes", "100000", "--server.body_timeout_s", "3")
GEN = {"generation": {"width": 32, "height": 32, "seed": 7, "num_frames": 3}}
TWO_MEDIA = script({"action": "image", "prompt": "a red cube"},
                   {"action": "video", "prompt": "a blue cube"},
                   {"action": "final", "text": "I see {media}"})
FAILING = script({"action": "image", "prompt": "a red cube"},
                 {"error": {"status": 400, "message": "the scripted Reasoner refuses"}})
#: Fields that differ by construction between two servers (time, process ids).
VOLATILE = {"created", "pid"}


@pytest.fixture(scope="module")
def fleet(cluster: RayCluster) -> Fleet:
    return deploy(cluster, *COMMON, *ON_GPUS)


@pytest.fixture(scope="module")
def single() -> Iterator[Server]:
    with Server(*SCRIPTED_UMM, *COMMON) as srv:
        yield srv


def normalized(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def answer(resp: httpx.Response) -> tuple[int, str, Any]:
    """Status, content type and the body, decoded and normalized."""
    ctype = resp.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        body: Any = normalized(resp.json())
    elif ctype.startswith("text/event-stream"):
        body = [(e, normalized(d)) for e, d in parse_sse(resp.text)]
    else:
        body = resp.text
    return resp.status_code, ctype, body


def both(fleet: Fleet, single: Server, method: str, path: str, **kwargs: Any
         ) -> tuple[tuple[int, str, Any], tuple[int, str, Any]]:
    out = []
    for base in (fleet.url, single.url):
        with httpx.Client(timeout=60) as client:
            out.append(answer(client.request(method, f"{base}{path}", **kwargs)))
    return out[0], out[1]


def body(prompt: str, rid: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "rid": rid, "stream": stream, "stage_params": GEN, **extra}


_counter = iter(range(1_000_000))


def rid(tag: str) -> str:
    """A request id used once on each server (one server refuses an id reused soon)."""
    return f"{tag}-{next(_counter)}"


@pytest.mark.parametrize("stream", [False, True])
def test_generate_matches_one_server(fleet: Fleet, single: Server, stream: bool) -> None:
    got, want = both(fleet, single, "POST", "/generate",
                     json=body(TWO_MEDIA, rid("gen"), stream))
    assert got == want
    assert got[0] == 200
    if stream:
        events = [e for e, _ in got[2]]
        assert events == ["segment", "segment", "segment", "complete", "message"]
        media = [d["data"]["url"] for e, d in got[2] if e == "segment" and d["kind"] != "text"]
        assert len(media) == 2 and all(u.startswith("data:") for u in media)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_matches_one_server(fleet: Fleet, single: Server, stream: bool) -> None:
    request = {"messages": [{"role": "user", "content": TWO_MEDIA}], "rid": rid("chat"),
               "stream": stream, "stage_params": GEN}
    got, want = both(fleet, single, "POST", "/v1/chat/completions", json=request)
    assert got == want and got[0] == 200


def test_a_stream_that_fails_ends_as_on_one_server(fleet: Fleet, single: Server) -> None:
    got, want = both(fleet, single, "POST", "/generate", json=body(FAILING, rid("f"), True))
    assert got == want
    assert got[2][-2][0] == "error" and got[2][-1] == ("message", "[DONE]")


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("GET", "/v1/models", {}),
    ("GET", "/openapi.json", {}),
    ("GET", "/docs", {}),
    ("GET", "/nope", {}),
    ("GET", "/generate", {}),
    ("POST", "/generate", {"json": {"prompt": 5}}),
    ("POST", "/generate", {"content": b"{}", "headers": {"content-type": "text/plain"}}),
    ("POST", "/generate", {"content": b"[" * 70_000}),
    ("POST", "/generate", {"content": iter([b"{", b" " * 70_000, b"}"])}),  # chunked, no length
    ("POST", "/v1/chat/completions", {"json": {"messages": "hi"}}),
])
def test_other_routes_and_errors_match_one_server(fleet: Fleet, single: Server, method: str,
                                                  path: str, kwargs: dict[str, Any]) -> None:
    if isinstance(kwargs.get("content"), Iterator):
        kwargs = {**kwargs, "content": list(kwargs["content"])}
        got = _chunked(fleet.url, path, kwargs["content"])
        want = _chunked(single.url, path, kwargs["content"])
    else:
        got, want = both(fleet, single, method, path, **kwargs)
    assert got == want


def _chunked(base: str, path: str, chunks: list[bytes]) -> tuple[int, str, Any]:
    with httpx.Client(timeout=60) as client:
        return answer(client.post(f"{base}{path}", content=iter(chunks),
                                  headers={"content-type": "application/json"}))


def test_health_and_metrics_have_the_shape_of_one_server(fleet: Fleet, single: Server) -> None:
    got, want = both(fleet, single, "GET", "/health")
    assert got[:2] == want[:2] == (200, "application/json")
    assert got[2]["status"] == "ok" and got[2].keys() == want[2].keys()
    assert got[2]["stages"].keys() == want[2]["stages"].keys()
    got = answer(whole_read(fleet.url, "/metrics"))  # every replica's answer in it
    want = answer(httpx.get(f"{single.url}/metrics", timeout=60))
    names = [re.findall(r"^# TYPE (\S+)", text, re.M) for text in (got[2], want[2])]
    own = [n for n in names[0] if n.startswith("sgl_omni_gateway_")]
    assert got[:2] == want[:2] and [n for n in names[0] if n not in own] == names[1]
    assert names[1] and set(own) == {"sgl_omni_gateway_waiting_requests",
                                     "sgl_omni_gateway_pending_body_bytes",
                                     "sgl_omni_gateway_retries_total",
                                     "sgl_omni_gateway_refusals_total",
                                     "sgl_omni_gateway_replica_exits_total",
                                     "sgl_omni_gateway_replica_silences_total",
                                     "sgl_omni_gateway_replica_up"}
    # every replica's series, each labelled with its replica (a scrape reads the whole fleet),
    # then the gateway's own, labelled with the gateway
    samples = [line for line in got[2].splitlines() if line and not line.startswith("#")]
    owner = [re.match(r'([^{ ]+)\{(replica|gateway)="([^"]+)"', line) for line in samples]
    assert all(owner), [s for s, m in zip(samples, owner, strict=True) if not m][:3]
    assert {m.group(3) for m in owner if m and m.group(2) == "replica"} == \
        {s["replica"] for s in fleet.stats()}
    assert all(m.group(1).startswith("sgl_omni_gateway_") == (m.group(2) == "gateway")
               for m in owner if m)
    assert len(re.findall(r"^# TYPE ", got[2], re.M)) == len(set(names[0]))  # one group each


def test_replicas_ask_for_their_gpus_and_their_stages_use_them(fleet: Fleet) -> None:
    stats = fleet.stats()
    assert len(stats) == 2 and len({s["node"] for s in stats}) == 2  # 2 GPUs each: one a node
    for s in stats:
        own = s["gpus"].split(",")
        assert len(own) == 2
        assert s["stages"]["generation"]["device"] == own[0]
        assert s["stages"]["reasoner"]["device"] == own[1]


def longest_generation(fleet: Fleet) -> dict[str, float]:
    """Each replica's longest measured generation (its quote's ``generation_s``; 0 before any)."""
    return {s["replica"]: (s["quote"] or {}).get("generation_s") or 0.0 for s in fleet.stats()}


def test_requests_spread_across_the_replicas(fleet: Fleet) -> None:
    """Concurrent requests to replicas with the same history spread over both.

    The deadline router sends a request where the generation stage is free soonest, charging
    each request it sent a replica that replica's longest measured generation: replicas that
    measured different generations earlier in this module (one ran a slower one) rightly take
    unequal shares. So first each replica measures a one-second generation (two requests at
    once: the router sends the second where the first did not go), then six at once."""
    slow = script({"action": "image", "prompt": "!sleep=1 a cube"}, {"action": "final",
                                                                     "text": "ok"})

    def one(i: int) -> int:
        return httpx.post(f"{fleet.url}/generate", json=body(slow, rid("spread")),
                          timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for _ in range(4):  # two at once: the second goes where the first did not
            if min(longest_generation(fleet).values()) >= 1.0:
                break
            assert list(pool.map(one, range(2))) == [200] * 2
    assert min(longest_generation(fleet).values()) >= 1.0, longest_generation(fleet)
    settle(fleet)  # the router's copy of the stats must show the new measurements too
    before = {s["replica"]: s["answers"].get("2xx", 0) for s in fleet.stats()}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert list(pool.map(one, range(6))) == [200] * 6
    after = {s["replica"]: s["answers"].get("2xx", 0) for s in fleet.stats()}
    served = {r: after[r] - before.get(r, 0) for r in after}
    assert sum(served.values()) == 6 and all(n >= 2 for n in served.values()), served


def test_stats_are_json(fleet: Fleet) -> None:
    """The routing stats cross Ray as plain data (the routers and `sgl-omni replicas`)."""
    for s in fleet.stats():
        assert json.loads(json.dumps(s)) == s


def test_a_body_that_does_not_fit_beside_those_held_is_refused_as_on_one_server(
        fleet: Fleet, single: Server) -> None:
    answers = []
    for base in (fleet.url, single.url):
        # an upload declared and partly sent: the gateway holds its share
        held, resp = refused_beside_upload(base, 60_000, refused_prompt(50_000))
        try:
            answers.append((answer(resp), resp.headers.get("retry-after")))
        finally:
            held.close()
        assert status_within(base, refused_prompt(50_000), 400).status_code == 400
    assert answers[0] == answers[1]
    assert answers[0][0][0] == 503 and "server.max_pending_body_bytes" in str(answers[0])
    assert gateway_metric(fleet, "sgl_omni_gateway_refusals_total", reason="body_budget") >= 1


def test_a_slow_body_gets_408_and_the_connection_closes_as_on_one_server(
        fleet: Fleet, single: Server) -> None:
    for url in (fleet.url, single.url):
        with connect(url) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         b"\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
            data, _ = read_until_closed(sock, 30)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), (url, data[:300])
        assert b"connection: close" in head.lower(), (url, head)
        assert json.loads(body)["error"]["code"] == 408
