"""Hostile bodies for every route: 0 answers outside the documented statuses, every error in
the JSON shape, and the server healthy and serving afterwards.

Two sources of bodies: schemathesis drives every operation ``/openapi.json`` lists with bodies
generated from its request schemas (``serve/schemas``) and its path parameters (``GET``/``DELETE
/v1/videos/{video_id}``...); the hypothesis strategies below, built from the same fields, mix
valid values with hostile ones a schema does not describe (integers past msgpack's range, lone
surrogates, NaN, wrong types, huge sizes), so requests get past the first check and reach the
stages.

Every example is recorded rather than asserted at once (no shrinking), so a failure lists all
bad answers; examples are fixed by ``derandomize`` and bounded by count and by a time budget.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.core import NotSet

from tests.reliability.kit import (
    BODY_LIMIT,
    SMALL,
    TrackedServer,
    answer_problem,
    healthy,
    script,
)

EXAMPLES = 200
BUDGET_S = 25.0  # per route; examples past it are skipped (and reported)
REQUEST_TIMEOUT_S = 10.0
#: A line of the threads' stacks a stage writes before it is killed for a stall or a hang.
STACK_LINE = re.compile(r'(Thread|Current thread) 0x[0-9a-f]+ |  File "')
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")
PNG_1PX = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4"
           "z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")

# --- hostile values --------------------------------------------------------------------------
HUGE_INTS = [2**64, 2**64 + 1, 2**63, -2**63 - 1, -2**64, 10**30, -1, 0, 16384, 2**31, 10**9]
ODD_STRINGS = ["\ud800", "a\udfffb", "\x00", "", " ", "x" * 20_000, "\u2028", "💥" * 50,
               "../../etc/passwd", "/etc/passwd", "file:///etc/passwd", "http://127.1:1/x"]
scalars = st.one_of(
    st.sampled_from(HUGE_INTS),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
hostile = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "\ud800", "url", "type"]),
                                                 inner, max_size=3)), max_leaves=6)


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A documented field's value: valid 9 times in 10, else hostile (so most bodies carry
    zero or one hostile value and get past the first check to the stages)."""
    return st.integers(0, 9).flatmap(lambda i: hostile if i == 0 else valid)


def deep(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


# --- documented fields -----------------------------------------------------------------------
ONE_IMAGE = script({"action": "image", "prompt": "a"}, {"action": "final", "text": "ok"})
ONE_VIDEO = script({"action": "video", "prompt": "b"}, {"action": "final", "text": "ok"})
prompts = st.sampled_from([ONE_IMAGE, ONE_VIDEO, script({"action": "final", "text": "hi"}), "hi",
                           script("not a decision"), "<omni-script>{]</omni-script>"])
gen_options = st.fixed_dictionaries({}, optional={
    k: either(v) for k, v in {
        "width": st.just(32), "height": st.just(32), "num_frames": st.just(3),
        "fps": st.just(8), "seed": st.integers(0, 2**32), "num_inference_steps": st.just(1),
        "guidance_scale": st.floats(0, 10), "negative_prompt": st.text(max_size=8)}.items()})
sampling = {"temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(-1, 50),
            "seed": st.integers(0, 2**32), "max_tokens": st.integers(1, 64),
            "stop": st.lists(st.text(max_size=4), max_size=2)}
messages = st.lists(st.fixed_dictionaries({
    "role": either(st.sampled_from(["user", "system", "assistant"])),
    "content": either(st.one_of(prompts, st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": either(prompts)}),
        st.fixed_dictionaries({"type": st.just("image_url"),
                               "image_url": either(st.fixed_dictionaries(
                                   {"url": either(st.just(PNG_1PX))}))})), max_size=3)))}),
    min_size=1, max_size=3)
media_lists = st.lists(either(st.just(PNG_1PX)), max_size=3)
chat_fields = {
    "model": st.text(max_size=8), "stream": st.booleans(), "rid": st.text(max_size=8),
    "images": media_lists, "videos": media_lists, "n": st.just(1),
    "stream_options": st.fixed_dictionaries({"include_usage": either(st.booleans())}),
    "stage_params": st.fixed_dictionaries({}, optional={
        "generation": either(gen_options),
        "reasoner": either(st.fixed_dictionaries({}, optional={
            k: either(v) for k, v in sampling.items()}))}),
    "stage_sampling": st.fixed_dictionaries({}, optional={"reasoner": either(st.fixed_dictionaries(
        {}, optional={k: either(v) for k, v in sampling.items()}))}),
    **sampling,
}


def body_of(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Objects of documented fields (each valid or hostile), now and then an undocumented key,
    and now and then a body that is not an object."""
    fields = st.fixed_dictionaries({k: either(v) for k, v in required.items()},
                                   optional={k: either(v) for k, v in optional.items()})
    extra = st.dictionaries(st.sampled_from(["bogus", "\ud800", "audios", "tools", "output_path"]),
                            hostile, max_size=1)
    return st.one_of(fields, st.builds(lambda a, b: {**a, **b}, fields, extra), hostile)


GENERATE = st.one_of(body_of({"prompt": prompts}, chat_fields),
                     body_of({"messages": messages}, chat_fields))
CHAT = body_of({"messages": messages}, chat_fields)
IMAGE_FIELDS = {"n": st.just(1), "size": st.sampled_from(["32x32", "16x3264", "0x0", "axb"]),
                "response_format": st.just("b64_json"), "output_format": st.just("png"),
                "model": st.text(max_size=8), "user": st.text(max_size=8),
                "guardrails": st.booleans(), "num_inference_steps": st.just(1),
                "seed": st.integers(0, 2**32), "extra_body": gen_options}
DIRECT_SIZE = {"width": st.just(32), "height": st.just(32)}
IMAGES = body_of({"prompt": st.sampled_from(["a cube", "!no-media x", ""]), **DIRECT_SIZE},
                 IMAGE_FIELDS)
VIDEOS = body_of({"prompt": st.sampled_from(["a clip", "!malformed x"]), **DIRECT_SIZE,
                  "num_frames": st.just(3)},
                 {**IMAGE_FIELDS, "seconds": st.integers(1, 2), "fps": st.just(8),
                  "input_reference": st.sampled_from([PNG_1PX, "/etc/passwd"]),
                  "video_url": st.sampled_from(["file:///x.mp4", "http://127.1:1/v.mp4"]),
                  "action_mode": st.just("forward_dynamics")})
ACTIONS = body_of({"domain_name": st.just("droid_lerobot"), "task": st.text(max_size=8)},
                  {"action_mode": st.sampled_from(["policy", "inverse_dynamics", "x"]),
                   "domain_id": st.integers(0, 9), "raw_action_dim": st.integers(1, 12),
                   "action_horizon": st.sampled_from([4, 16, 7]), "seed": st.integers(0, 9),
                   "num_inference_steps": st.just(1),
                   "input": st.fixed_dictionaries({}, optional={
                       "observation": st.fixed_dictionaries({}, optional={
                           "images": either(st.lists(st.just(PNG_1PX), max_size=2))}),
                       "video": either(st.fixed_dictionaries({"url": st.just("/etc/passwd")}))}),
                   "parameters": st.dictionaries(st.sampled_from(["seed", "raw_action_dim"]),
                                                 hostile, max_size=2)})

# --- the repros, as raw bodies -----------------------------------------------------
REPROS = [
    b'{"prompt":"hi","seed":18446744073709551616}',
    b'{"prompt":"hi","seed":-9223372036854775809}',
    b'{"prompt":"\\ud800"}',
    b'{"prompt":"hi","model":"\\ud800"}',
    b'{"prompt":"hi","\\ud800":1}',
    b'{"prompt":"hi","seed":' + b"9" * 5000 + b"}",
    b'{"prompt":"hi","stage_params":' + deep(600).encode() + b"}",
    deep(1500).encode(),
    b"[" * 100_000 + b"]" * 100_000,
    b'{"prompt":"hi","temperature":NaN}',
    b"", b"null", b"[]", b'"x"', b"\xff\xfe\x00", b"{",
]


def repro_bodies(base: dict[str, Any]) -> list[bytes]:
    """The repros, plus ``base`` (a route's minimal valid body) with each hostile value put in
    every field of it, in ``seed`` and in ``stage_params`` (generation and Reasoner fields)."""
    out = list(REPROS)
    stage_params = {"generation": {"seed": "@", "width": 32, "height": 32},
                    "reasoner": {"temperature": "@"}}
    for value in ("\\ud800", "18446744073709551616", "-9223372036854775809", "1e999",
                  "9" * 5000):
        for key in base:
            out.append(json.dumps({**base, key: "@"}).replace('"@"', value).encode())
        out.append(json.dumps({**base, "seed": "@"}).replace('"@"', value).encode())
        out.append(json.dumps({**base, "stage_params": stage_params}).replace('"@"', value)
                   .encode())
    return out


# --- the checks ------------------------------------------------------------------------------
class Recorder:
    """Sends requests and records every answer that breaks the contract."""

    def __init__(self, server: TrackedServer, route: str, method: str = "POST") -> None:
        self.server, self.route, self.method = server, route, method
        self.client = httpx.Client(timeout=REQUEST_TIMEOUT_S)
        self.problems: list[str] = []
        self.sent = self.skipped = 0
        self.started = time.monotonic()
        self.statuses: Counter[int] = Counter()

    def send(self, content: bytes, content_type: str = "application/json",
             path: str | None = None, method: str | None = None) -> httpx.Response | None:
        if time.monotonic() - self.started > BUDGET_S:
            self.skipped += 1
            return None
        self.sent += 1
        try:
            resp = self.client.request(method or self.method,
                                       self.server.url + (path or self.route), content=content,
                                       headers={"Content-Type": content_type})
        except httpx.TimeoutException:
            self.problems.append(f"no answer within {REQUEST_TIMEOUT_S:g} s: {content[:160]!r}")
            return None
        except httpx.HTTPError as exc:
            self.problems.append(f"connection failed ({exc!r}): {content[:160]!r}")
            return None
        self.statuses[resp.status_code] += 1
        problem = answer_problem(resp.status_code, resp.content,
                                 resp.headers.get("content-type", ""))
        if problem is not None:
            self.problems.append(f"{problem}\n    for {content[:160]!r}")
        return resp

    def send_json(self, body: Any) -> httpx.Response | None:
        return self.send(json.dumps(body, allow_nan=True).encode())

    def check(self, valid: Callable[[], httpx.Response]) -> None:
        """Every answer was documented, the server is healthy, a valid request succeeds."""
        self.client.close()
        after = valid()
        if not healthy(self.server.server):
            self.problems.append("the server is not healthy after the fuzzing")
        if after.status_code != 200:
            self.problems.append(f"a valid request after the fuzzing got {after.status_code}: "
                                 f"{after.text[:300]}")
        summary = (f"{self.route}: {self.sent} requests, {self.skipped} skipped (time budget), "
                   f"statuses {dict(sorted(self.statuses.items()))}")
        print(summary)
        if self.problems:  # with what the server said went wrong (a stage's fault, its cause,
            # and the threads' stacks a stalled or hung stage wrote before its kill)
            said = [line[:400] for line in self.server.server.log().splitlines()
                    if " ERROR " in line or " WARNING " in line or STACK_LINE.match(line)]
            raise AssertionError(
                summary + ", problems:\n" + "\n".join(f"- {p}" for p in self.problems[:40])
                + "\nthe server's last errors and warnings:\n" + "\n".join(said[-80:]))


def fuzz(recorder: Recorder, strategy: st.SearchStrategy[Any]) -> None:
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(body: Any) -> None:
        recorder.send_json(body)

    run()


def odd_wires(recorder: Recorder, body: dict[str, Any]) -> None:
    """Valid JSON sent as other content types (415 or 400, never parsed as JSON by accident)."""
    raw = json.dumps(body).encode()
    for content_type in ("text/plain", "multipart/form-data; boundary=x",
                         "application/x-www-form-urlencoded", "application/msgpack"):
        resp = recorder.send(raw, content_type)
        if resp is not None and resp.status_code == 200:
            recorder.problems.append(f"{content_type} body was served as JSON")


def post(server: TrackedServer, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=30)


VALID_GENERATE = {"prompt": ONE_IMAGE, "stage_params": {"generation": SMALL}}
VALID_CHAT = {"messages": [{"role": "user", "content": "hello"}]}
VALID_IMAGE = {"prompt": "a cube", "size": "32x32", "num_inference_steps": 1}
VALID_ACTION = {"domain_name": "droid_lerobot", "task": "pick", "num_inference_steps": 1}


@pytest.mark.timeout(120)
def test_generate_survives_hostile_bodies(umm: TrackedServer) -> None:
    rec = Recorder(umm, "/generate")
    for raw in repro_bodies({"prompt": "hi", "stage_params": {"generation": {"width": 32}}}):
        rec.send(raw)
    odd_wires(rec, VALID_GENERATE)
    fuzz(rec, GENERATE)
    rec.check(lambda: post(umm, "/generate", VALID_GENERATE))


@pytest.mark.timeout(120)
def test_interleaved_chat_survives_hostile_bodies(umm: TrackedServer) -> None:
    rec = Recorder(umm, "/v1/chat/completions")
    for raw in repro_bodies({**VALID_CHAT, "model": "m"}):
        rec.send(raw)
    odd_wires(rec, VALID_CHAT)
    fuzz(rec, CHAT)
    rec.check(lambda: post(umm, "/v1/chat/completions", VALID_CHAT))


@pytest.mark.timeout(120)
def test_text_only_chat_survives_hostile_bodies(chat: TrackedServer) -> None:
    rec = Recorder(chat, "/v1/chat/completions")
    for raw in repro_bodies({**VALID_CHAT, "model": "m"}):
        rec.send(raw)
    odd_wires(rec, VALID_CHAT)
    fuzz(rec, CHAT)
    rec.check(lambda: post(chat, "/v1/chat/completions", VALID_CHAT))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route, strategy, valid", [
    ("/v1/images/generations", IMAGES, VALID_IMAGE),
    ("/v1/actions/generations", ACTIONS, VALID_ACTION),
], ids=["images", "actions"])
def test_direct_routes_survive_hostile_bodies(direct: TrackedServer, route: str,
                                              strategy: st.SearchStrategy[Any],
                                              valid: dict[str, Any]) -> None:
    rec = Recorder(direct, route)
    for raw in repro_bodies(valid):
        rec.send(raw)
    too_large = rec.send(json.dumps({**valid, "prompt": "x" * BODY_LIMIT}).encode())
    if too_large is not None and too_large.status_code != 413:
        rec.problems.append(f"a body over server.max_body_bytes got {too_large.status_code}")
    fuzz(rec, strategy)
    rec.check(lambda: post(direct, route, valid))


@pytest.mark.timeout(120)
def test_video_jobs_survive_hostile_bodies(direct: TrackedServer) -> None:
    """Hostile ``POST /v1/videos`` bodies, then every job read back and deleted: the job list,
    each job and its deletion stay well-formed (a stored broken job must not poison them)."""
    rec = Recorder(direct, "/v1/videos")
    for raw in repro_bodies({"prompt": "a clip", "size": "32x32", "num_frames": 3}):
        rec.send(raw)
    fuzz(rec, VIDEOS)
    listing = rec.send(b"", path="/v1/videos", method="GET")
    ids = [job["id"] for job in listing.json()["data"]] if listing is not None \
        and listing.status_code == 200 else []
    for video_id in ids:
        rec.send(b"", path=f"/v1/videos/{video_id}", method="GET")
        rec.send(b"", path=f"/v1/videos/{video_id}/content", method="GET")
        rec.send(b"", path=f"/v1/videos/{video_id}", method="DELETE")
    rec.started = time.monotonic()  # the read-back has its own budget
    rec.check(lambda: post(direct, "/v1/images/generations", VALID_IMAGE))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["umm", "chat", "direct"])
def test_every_route_of_the_openapi_schema(which: str, request: pytest.FixtureRequest) -> None:
    """schemathesis drives every operation ``/openapi.json`` lists (bodies from the request
    schemas, path parameters, methods), 30 cases each."""
    server: TrackedServer = request.getfixturevalue(which)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    rec = Recorder(server, "")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations
    for operation in operations:
        @settings(max_examples=30, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(operation.as_strategy())
        def run(case: Any) -> None:
            body = b"" if isinstance(case.body, NotSet) \
                else json.dumps(case.body).encode()
            rec.send(body, path=case.formatted_path, method=case.method.upper())

        run()
    rec.check(lambda: httpx.get(f"{server.url}/v1/models", timeout=10))
