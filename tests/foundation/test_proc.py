"""Process-group hygiene (``runtime.proc.kill_led_group``): a stage's group is taken down with
its leftover children, and a process that got a reaped stage's pid later is never signalled."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil

from sglang_omni.engines.native.lifecycle import running
from sglang_omni.runtime.proc import kill_led_group

#: A group leader that starts a child and exits, leaving the child in its group.
LEAVES_A_CHILD = """
import os, subprocess, sys
os.setpgid(0, 0)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
"""


def wait_gone(proc: psutil.Process, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while running(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(proc)


def test_the_children_a_reaped_leader_left_in_its_group_are_killed() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEAVES_A_CHILD], stdout=subprocess.PIPE,
                              text=True)
    child = psutil.Process(int(leader.stdout.readline()))
    try:
        assert leader.wait(10) == 0
        assert running(child)
        kill_led_group(leader.pid, reaped=True)
        assert wait_gone(child)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_a_process_given_a_reaped_leaders_pid_is_left_alone() -> None:
    # Another process (here: one leading a group of its own) holds the number the reaped
    # leader had: neither it nor its group may be signalled.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                start_new_session=True)
    try:
        proc = psutil.Process(stranger.pid)
        kill_led_group(stranger.pid, reaped=True)
        time.sleep(0.3)
        assert running(proc)
    finally:
        stranger.kill()
        stranger.wait(10)


def test_a_leader_not_reaped_yet_is_killed_even_before_it_made_its_group() -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = psutil.Process(plain.pid)

    try:
        kill_led_group(plain.pid, reaped=False)
        assert wait_gone(proc)
    finally:
        plain.kill()
        plain.wait(10)
    assert plain.returncode == -9
