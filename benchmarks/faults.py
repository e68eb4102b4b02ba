"""Fault injection with requests in flight: how fast the server notices, answers and recovers.

Usage: python benchmarks/faults.py [--runs 3] [--in-flight 8] [--progress-timeout 3]
       [--allow-placebo] [--json benchmarks/results/faults.json]

Starts ``sgl-omni serve`` with the scripted engines (``configs/cpu-scripted.yaml``), with the
default heartbeat (1 s) and stall timeout (3 s), the default restart backoff (1 s), and
``progress_timeout_s`` set to ``--progress-timeout`` (its default, 60 s, would make the hung
engine rows take a minute each); ``restart_window_s`` is 1 s so that each fault is the window's
first restart (the backoff of a first restart) and ``max_restarts`` is ample. Then for each
stage (reasoner, generation) and each fault, ``--runs`` times:

* ``kill -9``: the stage process is killed;
* ``SIGSTOP``: the stage process is frozen (the server kills it; this script SIGCONTs and kills
  it if it is still there after the run);
* ``hang``: a request whose engine thread blocks for good while the process lives (the scripted
  ``!hang`` directive, a ``"hang": true`` Reasoner entry);
* ``error``: a request whose engine fails (``!error``: an unexpected exception in the
  generator; a Reasoner entry failing with status 500);
* ``placebo encode`` (generation only): issue 33's request through ``/generate``, a 1280x720
  video of 121 frames at x264's ``placebo`` preset (``stage_params.generation.x264_preset``),
  which once took the stage down as hung and, a few rounds on, the server for good. By default
  the server refuses the preset (400, ``server.allowed_x264_presets``); ``--allow-placebo``
  serves it (the encode takes minutes on a small CPU and must complete, 200, without the stage
  being judged hung: the encoder reports progress per frame). Run it as the issue did, ten
  rounds in a row: ``--stages generation --faults "placebo encode" --runs 10``.

Each fault hits the stage while ``--in-flight`` interleaved requests are running on it
(Reasoner turns of 10 s that report progress, or generations of 100 steps of 0.1 s). Times are
from the fault (the signal, or the faulty request's submission):

* ``/health not ok``: until ``/health`` leaves 200 "ok" (the error rows: it should stay ok);
* ``in-flight answered``: until every in-flight request, and the faulty one, has its answer
  (in the error rows the in-flight requests are short ones, 4 steps or a 2 s turn: the engine
  error must leave them alone, and each is served; generations run one at a time, so the faulty
  request, queued behind them, is answered last);
* ``new request``: a request of the same kind sent as ``/health`` leaves ok (the error rows: as
  the faulty request is answered); how long until its answer, and which (503 with Retry-After,
  or 200 served);
* ``their answers``: the statuses the in-flight and faulty requests got, in each run;
* ``ready again``: until ``/health`` says ok again;
* ``unanswered``: requests without an HTTP answer within 60 s of the fault (a JSON or SSE
  answer of any status counts; a dropped connection does not).

It prints one table: the median and range over the runs of each figure, and with ``--json``
writes every run's figures (and each row's stage restarts) there.

``--faults "media burst"`` runs the media burst instead (``media_burst.py``: ``--burst`` chat
requests at once, each naming ``--burst-parts`` remote images just under the fetch limit; peak
RSS of the server and its stages, refusals, stage restarts; JSON in ``--burst-out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import media_burst  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
UMM_CONFIG = ROOT / "configs" / "cpu-scripted.yaml"
ANSWER_WITHIN_S = 60.0
STEP_TIME_S = 0.1
STEPS = 30
SHORT_STEPS = 4
REASONER_S = 10.0
SHORT_REASONER_S = 2.0
SMALL = {"width": 32, "height": 32}
FAULTS = ("kill -9", "SIGSTOP", "hang", "error", "placebo encode")
#: The faults a request makes (the faulty request is sent, not a signal); the in-flight
#: requests are short ones and must be served.
REQUEST_FAULTS = ("error", "placebo encode")
#: Issue 33's video: what it asks of the generation stage.
PLACEBO = {"width": 1280, "height": 720, "num_frames": 121, "fps": 24,
           "num_inference_steps": 1, "x264_preset": "placebo"}
#: How long the placebo video may take when the server allows it (its encode, on a small CPU).
PLACEBO_WITHIN_S = 900.0
STAGES = ("reasoner", "generation")
HTTP = httpx.Client(timeout=ANSWER_WITHIN_S, limits=httpx.Limits(max_connections=64))


def script(*entries: Any) -> str:
    return f"<omni-script>{json.dumps(list(entries))}</omni-script> go"


def image(prompt: str, steps: int) -> dict[str, Any]:
    return {"prompt": script({"action": "image", "prompt": prompt},
                             {"action": "final", "text": "done"}),
            "stage_params": {"generation": {**SMALL, "num_inference_steps": steps}}}


def thinking(entry: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": script(entry)}


def in_flight_body(stage: str, short: bool = False) -> dict[str, Any]:
    """A request running on ``stage``; ``short``: one that ends in well under a second."""
    if stage == "generation":
        return image("in flight", SHORT_STEPS if short else STEPS)
    return thinking({"action": "final", "text": "in flight",
                     "delay_s": SHORT_REASONER_S if short else REASONER_S})


def probe_body(stage: str) -> dict[str, Any]:
    """A short request that needs ``stage``."""
    if stage == "generation":
        return image("probe", 2)
    return thinking({"action": "final", "text": "probe"})


def faulty_body(stage: str, fault: str) -> dict[str, Any]:
    if fault == "placebo encode":
        return {"prompt": script({"action": "video", "prompt": "a cube turning"},
                                 {"action": "final", "text": "done"}),
                "stage_params": {"generation": dict(PLACEBO)}}
    if stage == "generation":
        return image("!hang" if fault == "hang" else "!error", 4)
    if fault == "hang":
        return thinking({"hang": True})
    return thinking({"error": {"status": 500, "message": "scripted engine error"}})


# --- the server --------------------------------------------------------------------------------
class Served:
    """A ``sgl-omni serve`` subprocess on a free port, logging to a temp file."""

    def __init__(self, progress_timeout_s: float, *extra: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="omni-faults-", suffix=".log",
                                               delete=False)
        flags = ["--generation.factory.step_time_s", str(STEP_TIME_S)]
        for stage in STAGES:
            flags += [f"--{stage}.factory.progress_timeout_s", str(progress_timeout_s),
                      f"--{stage}.factory.restart_window_s", "1",
                      f"--{stage}.factory.max_restarts", "1000"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_omni", "serve", "--config", str(UMM_CONFIG),
             "--port", str(self.port), *flags, *extra],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if not self.wait_ok(120):
            self.stop()
            raise SystemExit(f"the server did not become ready in 120 s; log: {self.log.name}")

    def health(self) -> tuple[int, dict[str, Any]]:
        resp = HTTP.get(f"{self.url}/health", timeout=5)
        return resp.status_code, resp.json()

    def wait_ok(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited; log: {self.log.name}")
            try:
                if self.health()[0] == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return False

    def stage_pid(self, stage: str) -> int:
        return int(self.health()[1]["stages"][stage]["pid"])

    def restarts(self, stage: str) -> int:
        return int(self.health()[1]["stages"][stage]["restarts"])

    def submitted(self, stage: str) -> float:
        prefix = f'sgl_omni_stage_jobs_total{{outcome="submitted",stage="{stage}"}} '
        for line in HTTP.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(prefix):
                return float(line[len(prefix):])
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


# --- one request -------------------------------------------------------------------------------
@dataclass
class Sent:
    """A request on its own thread: when it was answered, with what."""

    started: float = 0.0
    ended: float | None = None
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def post(cls, url: str, body: dict[str, Any], timeout: float = ANSWER_WITHIN_S) -> Sent:
        sent = cls(started=time.monotonic())
        threading.Thread(target=sent._run, args=(url, body, timeout), daemon=True).start()
        return sent

    def _run(self, url: str, body: dict[str, Any], timeout: float) -> None:
        try:
            resp = HTTP.post(f"{url}/generate", json=body, timeout=timeout)
            resp.json()  # an answer is a whole JSON body
            self.status = resp.status_code
            self.retry_after = resp.headers.get("retry-after")
            self.ended = time.monotonic()
        except (httpx.HTTPError, ValueError) as exc:
            self.error = repr(exc)
        finally:
            self.done.set()


class HealthWatch:
    """Polls ``/health`` every 20 ms from ``start``: when it left ok and when it was back."""

    def __init__(self, served: Served, start: float) -> None:
        self.served = served
        self.start = start
        self.left: float | None = None
        self.back: float | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            try:
                status = self.served.health()[0]
            except httpx.HTTPError:
                status = 0
            now = time.monotonic()
            if status != 200 and self.left is None:
                self.left = now
            elif status == 200 and self.left is not None and self.back is None:
                self.back = now
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self._thread.join()


# --- one run -----------------------------------------------------------------------------------
@dataclass
class Run:
    health_not_ok: float | None
    in_flight_answered: float | None
    new_request: float | None
    new_answer: str
    ready_again: float | None
    unanswered: int
    #: The in-flight and faulty requests' statuses, counted ("200": 8 ...).
    statuses: dict[str, int]
    #: The stage's restarts during the run (from /health).
    restarts: int = 0
    #: Seconds from the faulty request's submission to its answer (request faults).
    faulty_answered: float | None = None


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def one_run(served: Served, stage: str, fault: str, in_flight: int) -> Run:
    before = served.submitted(stage)
    restarts_before = served.restarts(stage)
    request_fault = fault in REQUEST_FAULTS
    faulty: Sent | None = None
    if fault == "hang":  # first: generations run one at a time, in admission order
        faulty = Sent.post(served.url, faulty_body(stage, fault))
        if not wait_until(lambda: served.submitted(stage) >= before + 1, 30):
            raise SystemExit(f"the hanging request did not reach the {stage} stage")
    flights = [Sent.post(served.url, in_flight_body(stage, short=request_fault))
               for _ in range(in_flight)]
    running = in_flight if stage == "reasoner" else 0 if fault == "hang" else 1
    reached = before + running + (1 if fault == "hang" else 0)
    if not wait_until(lambda: served.submitted(stage) >= reached, 30):
        raise SystemExit(f"the in-flight requests did not reach the {stage} stage")
    time.sleep(0.5)  # let the stage start them, and the server admit the queued ones
    stage_proc = psutil.Process(served.stage_pid(stage))
    t0 = faulty.started if faulty is not None else time.monotonic()
    watch = HealthWatch(served, t0)
    if fault == "kill -9":
        stage_proc.send_signal(signal.SIGKILL)
    elif fault == "SIGSTOP":
        stage_proc.send_signal(signal.SIGSTOP)
    elif request_fault:
        t0 = time.monotonic()
        within = PLACEBO_WITHIN_S if fault == "placebo encode" else ANSWER_WITHIN_S
        faulty = Sent.post(served.url, faulty_body(stage, fault), timeout=within)
    try:
        probe: Sent | None = None
        if request_fault:
            assert faulty is not None
            faulty.done.wait(within)
            probe = Sent.post(served.url, probe_body(stage))
        elif wait_until(lambda: watch.left is not None, ANSWER_WITHIN_S):
            probe = Sent.post(served.url, probe_body(stage))
        everyone = [*flights, *([faulty] if faulty else []), *([probe] if probe else [])]
        for sent in everyone:
            sent.done.wait(max(0.0, (t0 if sent is not probe else probe.started)
                               + ANSWER_WITHIN_S - time.monotonic()))
        if watch.left is not None:
            wait_until(lambda: watch.back is not None, ANSWER_WITHIN_S)
    finally:
        watch.close()
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                if stage_proc.is_running() and fault in ("SIGSTOP", "hang"):
                    stage_proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
    served.wait_ok(60)
    answered = [*flights, *([faulty] if faulty else [])]
    ends = [s.ended for s in answered]
    probe_answer = "none"
    if probe is not None and probe.ended is not None:
        probe_answer = f"{probe.status}" + (" + Retry-After" if probe.status == 503
                                              and probe.retry_after else "")
    return Run(
        health_not_ok=None if watch.left is None else watch.left - t0,
        in_flight_answered=None if None in ends else max(e for e in ends if e) - t0,
        new_request=None if probe is None or probe.ended is None
        else probe.ended - probe.started,
        new_answer=probe_answer,
        ready_again=None if watch.back is None else watch.back - t0,
        unanswered=sum(1 for s in everyone if s.ended is None),
        statuses=dict(Counter(str(s.status) for s in answered)),
        restarts=served.restarts(stage) - restarts_before,
        faulty_answered=None if faulty is None or faulty.ended is None or not request_fault
        else faulty.ended - faulty.started,
    )


# --- the table ---------------------------------------------------------------------------------
def spread(values: list[float | None], never: str) -> str:
    """``median (min-max)`` of the runs, ``never`` when no run had the figure."""
    got = [v for v in values if v is not None]
    if not got:
        return never
    text = f"{statistics.median(got):.2f} ({min(got):.2f}-{max(got):.2f})"
    missing = len(values) - len(got)
    return text + (f", {never} in {missing}" if missing else "")


def tally(statuses: dict[str, int]) -> str:
    """``8x 500`` or ``8x 200, 1x 500``."""
    return ", ".join(f"{n}x {status}" for status, n in sorted(statuses.items()))


def row(stage: str, fault: str, runs: list[Run]) -> str:
    answers = sorted({r.new_answer for r in runs})
    return " | ".join([
        f"| {stage}", fault,
        spread([r.health_not_ok for r in runs], "stays ok"),
        spread([r.in_flight_answered for r in runs], "never"),
        " / ".join(sorted({tally(r.statuses) for r in runs})),
        spread([r.new_request for r in runs], "never") + " " + "/".join(answers),
        spread([r.ready_again for r in runs], "never" if fault not in REQUEST_FAULTS else "-"),
        str(sum(r.unanswered for r in runs)) + " |",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--progress-timeout", type=float, default=3.0,
                        help="the stages' progress_timeout_s (the hung engine rows)")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--allow-placebo", action="store_true",
                        help="serve x264's placebo preset (server.allowed_x264_presets): the "
                             "placebo encode row then measures the long encode itself")
    parser.add_argument("--json", help="also write every run's figures to this JSON file")
    media_burst.add_arguments(parser)
    args = parser.parse_args()
    if "media burst" in args.faults.split(","):
        return media_burst.from_arguments(args)
    extra = ["--server.allowed_x264_presets", "[ultrafast, medium, placebo]"] \
        if args.allow_placebo else []
    served = Served(args.progress_timeout, *extra)
    results: list[dict[str, Any]] = []
    lines = [
        f"{args.in_flight} requests in flight, {args.runs} runs; seconds from the fault, median "
        f"(range); progress_timeout_s {args.progress_timeout:g}",
        "",
        "| stage | fault | /health not ok | in-flight answered | their answers "
        "| new request answered | ready again | unanswered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    try:
        for stage in args.stages.split(","):
            for fault in args.faults.split(","):
                if fault == "placebo encode" and stage != "generation":
                    continue  # a generation's encode: the Reasoner has none
                runs = []
                for i in range(args.runs):
                    run = one_run(served, stage, fault, args.in_flight)
                    print(f"# {stage} {fault} run {i + 1}: {run}", flush=True)
                    runs.append(run)
                lines.append(row(stage, fault, runs))
                results.append({"stage": stage, "fault": fault,
                                "runs": [asdict(r) for r in runs]})
                if fault == "placebo encode":
                    print(placebo_line(runs), flush=True)
    finally:
        served.stop()
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "in_flight": args.in_flight, "runs": args.runs,
            "progress_timeout_s": args.progress_timeout, "allow_placebo": args.allow_placebo,
            "cpus": os.cpu_count(), "load_after": os.getloadavg(), "rows": results},
            indent=1) + "\n")
    return 0


def placebo_line(runs: list[Run]) -> str:
    """The placebo encode's own figures: each round's answer, and the stage's restarts."""
    answers = [tally(r.statuses) for r in runs]
    return (f"# placebo encode: {len(runs)} round(s); the faulty request answered in "
            f"{spread([r.faulty_answered for r in runs], 'never')} s; stage restarts "
            f"{sum(r.restarts for r in runs)}; /health left ok in "
            f"{sum(1 for r in runs if r.health_not_ok is not None)} round(s); answers: "
            f"{' / '.join(sorted(set(answers)))}")


if __name__ == "__main__":
    sys.exit(main())
