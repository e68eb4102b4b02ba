"""Process hygiene: a stage dies with the server, and takes its children down with it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: deliver ``sig`` to this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except OSError:
        return


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal every process of group ``pgid``; a group already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return


def kill_led_group(pid: int | None, reaped: bool, sig: int = signal.SIGKILL) -> None:
    """Signal the child ``pid``, which leads a process group of its own, and what is left of
    its group (its children); ``reaped``: the child has exited and been waited for.

    Once the leader is reaped its pid is free for reuse, except while members of its group live
    (the kernel gives the number of a live group to no process). So a process numbered so after
    the leader was reaped is another's, perhaps leading a group of its own (pids wrap at 32768 by
    default): it and its group are left alone. A leader not reaped yet is signalled itself too
    (it may not have made its group yet)."""
    if not pid or (reaped and psutil.pid_exists(pid)):
        return
    kill_group(pid, sig)
    if not reaped:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return


def start_idle_child() -> subprocess.Popen:
    """An idle child process standing in for a native engine worker (scripted backend)."""
    code = "import time\nwhile True: time.sleep(3600)"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)
