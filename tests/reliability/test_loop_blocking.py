"""Nothing blocks the server's event loop under a reliability load (issue 28, item 4).

The server runs with asyncio's debug mode and a 50 ms slow-callback threshold
(``SGLANG_OMNI_SLOW_CALLBACK_S``, :mod:`sglang_omni.runtime.loop_watch`), so each callback that
holds its loop that long (computing, or blocked) is logged as ``Executing <...> took N
seconds``; a callback that only waited for a core of the busy test machine is not. The load:
concurrent interleaved requests of every form, two relaying 8 MiB videos to the Reasoner (one
answered as JSON, one streamed), one carrying a 4 MiB inline picture from the client, clients
that go away mid-request (aborts), and a generation stage killed with a request in flight (its
restart). Every request gets its answer, and the server's log names no callback that computed
on the loop for :data:`COMPUTED_S` (its thread's CPU time, not its wall time: waiting for a core
of a busy machine is not holding the loop). Callbacks are logged from 50 ms, but judged from
100 ms of CPU: on the two-core CI machine with other work beside it, a thread's CPU time for the
same work reads up to about 1.6x its quiet figure (caches and memory bandwidth shared; seen here:
0.053 and 0.073 s of CPU for relays of 8 MiB videos at a load of 7). A callback logged only as
*blocked* (wall time without CPU: a wait) is not judged either: on a loaded machine a wait for the
interpreter lock, whose holder the kernel preempted, looks the same (CI failed on "0.058 seconds
(0.001 s of CPU, blocked 9 times)" under load); such lines are printed for the reader instead.
Stage processes keep their own loops (not judged here).
"""

from __future__ import annotations

import base64
import io
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability.kit import ROOMY, SMALL, healthy, script
from tests.server import SCRIPTED_UMM, Server

MiB = 1024 * 1024
SLOW_S = 0.05
COMPUTED_S = 0.1
SLOW = re.compile(r"Executing .* took (\d+\.\d+) seconds \((\d+\.\d+) s of CPU")
OPTIONS = {**SMALL, "num_inference_steps": 1}
QUICK_SUPERVISION = [f"--{stage}.factory.{key}={value}" for stage in ("reasoner", "generation")
                     for key, value in (("heartbeat_interval_s", "0.2"),
                                        ("restart_backoff_s", "0.2"), ("max_restarts", "10"))]


@pytest.fixture(scope="module")
def debug_server() -> Iterator[Server]:
    server = Server(*SCRIPTED_UMM, *ROOMY, *QUICK_SUPERVISION,
                    env={"SGLANG_OMNI_SLOW_CALLBACK_S": str(SLOW_S)})
    try:
        yield server
    finally:
        server.stop()


def noise_png_url(side: int) -> str:
    """A PNG data URL that does not compress (about 4 bytes of base64 a pixel)."""
    pixels = np.random.default_rng(3).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def generate(url: str, prompt: str, stream: bool = False, timeout: float = 120,
             **extra: object) -> httpx.Response:
    body = {"prompt": prompt, "stream": stream, "stage_params": {"generation": OPTIONS}, **extra}
    return httpx.post(f"{url}/generate", json=body, timeout=timeout)


def chat(url: str, prompt: str, stream: bool, image: str | None = None) -> httpx.Response:
    content: object = prompt if image is None else [
        {"type": "text", "text": prompt}, {"type": "image_url", "image_url": {"url": image}}]
    body = {"messages": [{"role": "user", "content": content}], "stream": stream,
            "stage_params": {"generation": OPTIONS}}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def ok(resp: httpx.Response, marker: str) -> str | None:
    if resp.status_code != 200 or marker not in resp.text:
        return f"{resp.request.url.path}: {resp.status_code} {resp.text[:300]!r}"
    return None


def interleaved(url: str, i: int) -> str | None:
    kinds = ["image", "video", "image", "video"][: 1 + i % 4]
    marker = f"done-{i}"
    prompt = script(*[{"action": k, "prompt": f"{k} {i}.{n}"} for n, k in enumerate(kinds)],
                    {"action": "final", "text": marker})
    resp = generate(url, prompt, stream=i % 2 == 0) if i % 3 else chat(url, prompt, i % 2 == 0)
    return ok(resp, marker)


def large_videos(url: str, i: int) -> str | None:
    prompt = script(*[{"action": "video", "prompt": f"!size={8 * MiB} clip {i}.{n}"}
                      for n in range(2)], {"action": "final", "text": f"big-{i}"})
    return ok(generate(url, prompt, stream=i % 2 == 1), f"big-{i}")  # one JSON, one stream


def large_picture(url: str) -> str | None:
    picture = noise_png_url(1024)  # 3 MiB of PNG, 4 MiB of base64 in the request
    prompt = script({"action": "image", "prompt": "after the picture"},
                    {"action": "final", "text": "seen"})
    return ok(chat(url, prompt, stream=False, image=picture), "seen")


def client_goes_away(url: str, stream: bool) -> str | None:
    held = script({"action": "image", "prompt": "!sleep=30 held"}, {"action": "final", "text": "x"})
    body = {"prompt": held, "stream": stream, "stage_params": {"generation": OPTIONS}}
    try:
        if stream:
            with httpx.stream("POST", f"{url}/generate", json=body, timeout=30) as resp:
                for _ in resp.iter_lines():  # the first event: the request is running
                    break
        else:
            httpx.post(f"{url}/generate", json=body, timeout=1.0)
    except httpx.TimeoutException:
        pass
    return None


def jobs_in_flight(url: str, stage: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "sgl_omni_stage_jobs_total"
              and s.labels.get("stage") == stage}
    return counts["submitted"] - counts["completed"] - counts["failed"] - counts["aborted"]


def kill_generation_mid_request(server: Server) -> str | None:
    """SIGKILL the generation stage with a request in it; the request fails, the stage comes
    back (a new pid) and serves the next request."""
    held = script({"action": "image", "prompt": "!sleep=30 held"}, {"action": "final", "text": "x"})
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, server.url, held)
        deadline = time.monotonic() + 30
        while jobs_in_flight(server.url, "generation") < 1:
            assert time.monotonic() < deadline, "the held request never reached the stage"
            time.sleep(0.05)
        pid = server.stage_pid("generation")
        os.kill(pid, signal.SIGKILL)
        failed = running.result(60)
    if failed.status_code == 200 and "error" not in failed.text:
        return f"the killed stage's request did not fail: {failed.text[:300]!r}"
    deadline = time.monotonic() + 30
    while not (healthy(server) and server.stage_pid("generation") != pid):
        if time.monotonic() > deadline:
            return "the generation stage did not come back"
        time.sleep(0.05)
    return interleaved(server.url, 99)


@pytest.mark.timeout(240)
def test_reliability_load_never_blocks_the_server_loop(debug_server: Server) -> None:
    url = debug_server.url
    assert f"callbacks holding the loop {SLOW_S:g} s or more are logged" in debug_server.log()
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(interleaved, url, i) for i in range(24)]
        futures += [pool.submit(large_videos, url, i) for i in range(2)]
        futures.append(pool.submit(large_picture, url))
        futures += [pool.submit(client_goes_away, url, stream) for stream in (False, True)]
        problems = [p for f in futures if (p := f.result(180)) is not None]
    killed = kill_generation_mid_request(debug_server)
    if killed is not None:
        problems.append(killed)
    assert not problems, "\n".join(problems)
    held = [(line, float(m.group(2))) for line in debug_server.log().splitlines()
            if (m := SLOW.search(line)) and " stage] " not in line]
    waits = [line for line, cpu in held if cpu < COMPUTED_S]
    if waits:
        print("callbacks logged but not judged (waits, or short work on a busy machine):",
              *waits[:20], sep="\n")
    computed = [line for line, cpu in held if cpu >= COMPUTED_S]
    assert not computed, "the server's event loop computed too long:\n" + "\n".join(computed[:20])
