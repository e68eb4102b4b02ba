"""Process hygiene: a stage dies with the server, and takes its children down with it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

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


def start_idle_child() -> subprocess.Popen:
    """An idle child process standing in for a native engine worker (scripted backend)."""
    code = "import time\nwhile True: time.sleep(3600)"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)
