"""Startup that tells the user what is happening: the port is checked before anything loads,
``/health`` answers ``starting`` (503) while the stages load, one line says when it is ready
(the playground's URL and a curl that works), ``--help`` shows the defaults, the Makefile takes
``PORT=``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.kit import error_message, wait_until
from tests.metrics.kit import Scrape
from tests.server import SCRIPTED_UMM, Server, free_port

ROOT = Path(__file__).parents[2]
SERVE = [sys.executable, "-m", "sglang_omni", "serve"]


def test_a_port_in_use_fails_at_once_before_anything_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
        for args in ([*SCRIPTED_UMM], ["--demo"]):  # --demo: before its checkpoint is built
            done = subprocess.run([*SERVE, *args, "--port", port], capture_output=True,
                                  text=True, timeout=60, env=env, cwd=ROOT)
            assert done.returncode == 2, done.stderr
            assert f"cannot listen on 127.0.0.1:{port}: address already in use" in done.stderr
            # the way to another port, for `sgl-omni serve` and for `make demo` users
            assert "--port 8001" in done.stderr and "make demo PORT=8001" in done.stderr
            assert "stage" not in done.stderr + done.stdout  # no stage was started
        assert not (tmp_path / "cache").exists()  # nor the demo checkpoint built


#: A Reasoner whose simulated load outlasts any test: the server stays ``starting`` for as long
#: as the test looks (a few seconds of delay raced the test's own checks on a loaded machine).
LOADS_FOR_AN_HOUR = ("--reasoner.factory.start_delay_s", "3600")


def test_health_says_starting_and_requests_are_refused_while_the_stages_load() -> None:
    server = Server(*SCRIPTED_UMM, *LOADS_FOR_AN_HOUR, wait_ready=False)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"{server.url}/health", timeout=1).status_code > 0
            except httpx.HTTPError:
                return False

        assert wait_until(answers, timeout=30)
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.headers["retry-after"]
        assert health.json()["status"] == "starting"
        assert health.json()["stages"]["reasoner"]["status"] == "starting"
        early = httpx.post(f"{server.url}/generate", json={"prompt": "hi"})
        assert early.status_code == 503 and "the server is starting" in error_message(early)
        assert Scrape(server).value("sgl_omni_admission_refusals_total", reason="stage_down") == 1
        assert "ready in" not in server.log()
    finally:
        server.stop()


def test_one_ready_line_names_the_playground_and_a_curl_that_works() -> None:
    server = Server(*SCRIPTED_UMM, "--reasoner.factory.start_delay_s", "1", wait_ready=False)
    try:
        server.wait_ready(60)
        assert wait_until(lambda: "sgl-omni: ready in" in server.log(), timeout=10)
        lines = [line for line in server.log().splitlines() if "sgl-omni: ready in" in line]
        assert len(lines) == 1
        line = lines[0]
        assert f"open {server.url}/ (the playground)" in line
        curl = re.search(r"or try: (curl .*)$", line)
        assert curl and f"{server.url}/generate" in curl[1]
        out = subprocess.run(curl[1], shell=True, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "event: complete" in out.stdout and "[DONE]" in out.stdout
        # the scripted server's curl is a scripted request: an image, then the answer; silent
        # (no progress meter) and every line cut short (no screen of base64)
        assert '"kind": "image"' in out.stdout and "no script entry" not in out.stdout
        assert out.stderr == "" and max(map(len, out.stdout.splitlines())) <= 150
        assert "random weights" not in line  # the scripted engines load no checkpoint
    finally:
        server.stop()


def test_the_stage_processes_start_together_before_the_server_builds_its_app() -> None:
    """Start-up overlaps: both stage processes are started at once, before the server imports
    and builds its app (uvicorn's lifespan comes after that), so their imports and loads run
    while the server's own start does."""
    server = Server(*SCRIPTED_UMM, "--reasoner.factory.start_delay_s", "2")
    try:
        assert wait_until(lambda: "all stages ready" in server.log(), timeout=10)
        lines = server.log().splitlines()

        def first(text: str) -> int:
            return next(i for i, line in enumerate(lines) if text in line)

        spawned = first("stage processes started: ")
        assert re.search(r"stage processes started: generation \(pid \d+\), reasoner "
                         r"\(pid \d+\)$", lines[spawned])
        ready = [i for i, line in enumerate(lines) if "ready (backend scripted)" in line]
        assert len(ready) == 2 and spawned < min(ready)  # both started before either was ready
        assert spawned < first("Waiting for application startup.")
        assert sum("stage processes started" in line for line in lines) == 1
    finally:
        server.stop()


#: Log lines after which the Ctrl-C test signals: the stages have spawned (the app is then being
#: built, or just built), and uvicorn has taken the signals (its lifespan began the stages' wait).
SIGNALLED_AFTER = {"spawned": "stage processes started",
                   "serving": "Waiting for application startup."}


@pytest.mark.parametrize("moment", SIGNALLED_AFTER)
def test_ctrl_c_while_the_stages_start_stops_them_cleanly(tmp_path: Path, moment: str) -> None:
    """The stages spawn before the server's app is built: Ctrl-C then, or once uvicorn has its
    signals while the Reasoner still loads, stops them too, exits 0, leaves no scratch folder
    and prints no traceback."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = Server(*SCRIPTED_UMM, *LOADS_FOR_AN_HOUR, wait_ready=False,
                    env={"TMPDIR": str(scratch)})
    try:
        assert wait_until(lambda: SIGNALLED_AFTER[moment] in server.log(), timeout=60)
        # the stages the log names (multiprocessing's resource tracker, also a child, ends on
        # its own once the server has gone)
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", server.log())]
        stages = [p for p in server.descendants() if p.pid in pids]
        assert len(stages) == 2
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(60) == 0, server.log()[-3000:]
        assert not [p for p in stages if p.is_running() and p.status() != "zombie"]
        assert sorted(p.name for p in scratch.iterdir()) == []
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_help_shows_the_host_and_port_defaults() -> None:
    out = subprocess.run([*SERVE, "--help"], capture_output=True, text=True, timeout=60)
    flat = " ".join(out.stdout.split())
    assert "(default: 127.0.0.1;" in flat and "(default: 8000)" in flat
    assert "--log-format {text,json}" in flat


def test_the_makefile_takes_port_and_host() -> None:
    port = str(free_port())
    for target in ("demo", "serve-demo"):
        out = subprocess.run(["make", "-n", target, f"PORT={port}", "HOST=0.0.0.0"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"--host 0.0.0.0 --port {port}" in out.stdout


READY_PARTS = re.compile(r"ready \(backend scripted\) [\d.]+ s after the process started: "
                         r"[\d.]+ s to reach the engine, ([\d.]+) s in the engine's start "
                         r"\(engine module ([\d.]+) s, start ([\d.]+) s\)$")
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.M)


def test_the_scripted_server_and_stages_import_no_model_library_and_say_where_start_went() -> None:
    """The server process and the scripted stages never import torch, transformers or diffusers
    (every process prints its imports into the log: ``PYTHONPROFILEIMPORTTIME``), and each
    stage's ready line splits its engine's start into parts."""
    with Server(*SCRIPTED_UMM, env={"PYTHONPROFILEIMPORTTIME": "1"}) as server:
        assert wait_until(lambda: "all stages ready" in server.log(), timeout=30)
        log = server.log()
    imported = {m.split(".")[0] for m in IMPORTED.findall(log)}
    assert "sglang_omni" in imported and "uvicorn" in imported  # the profile covers the server
    assert not imported & {"torch", "transformers", "diffusers", "torchvision", "accelerate"}
    lines = [line for line in log.splitlines() if "ready (backend scripted)" in line]
    assert len(lines) == 2
    for line in lines:
        m = READY_PARTS.search(line)
        assert m, line
        total, parts = float(m[1]), float(m[2]) + float(m[3])
        assert abs(total - parts) <= 0.15  # the parts are the start, rounded to 0.1 s each
