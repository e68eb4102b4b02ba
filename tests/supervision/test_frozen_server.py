"""A frozen server (its process stopped, as a Ray replica given up on is left): its stages, once
its heartbeats stop, exit with their children after ten seconds (twice their
``stall_timeout_s``, at least ten), so the GPUs they hold are freed even if nobody ever kills
the stopped server. A server that merely waits long between heartbeats never triggers it."""

from __future__ import annotations

import os
import signal
import time

import psutil

from sglang_omni.engines.native.lifecycle import running
from tests.server import SCRIPTED_UMM, Server
from tests.supervision.kit import fast

EXIT_WITHIN_S = 10 + 15  # stage_process.MIN_SERVER_SILENCE_S, and a loaded machine


def alive(procs: set[psutil.Process]) -> set[psutil.Process]:
    return {p for p in procs if running(p)}


def test_the_stages_of_a_frozen_server_exit_with_their_children() -> None:
    with Server(*SCRIPTED_UMM, "--reasoner.factory.children", "1",
                "--generation.factory.children", "1",
                *fast("reasoner", "generation", stall_s=1.0)) as server:
        stages = [psutil.Process(server.stage_pid(name)) for name in ("reasoner", "generation")]
        tree = {p for stage in stages for p in (stage, *stage.children(recursive=True))}
        assert len(tree) == 4  # two stages, a child each
        time.sleep(12)  # heartbeats going on past the limit: nothing exits
        assert alive(tree) == tree
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + EXIT_WITHIN_S
            while alive(tree) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not alive(tree), f"left running: {alive(tree)}"
            assert "sent no heartbeat" in server.log()
        finally:
            os.kill(server.proc.pid, signal.SIGKILL)
