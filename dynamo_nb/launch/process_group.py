"""Child processes in their own process group: start, signal and stop the whole group.

`LocalServices` (etcd, nats-server) and `dynamo_nb.launch` (components) share these, so a
stop is the same everywhere: SIGTERM to the group, wait, SIGKILL to the group, and a last
SIGKILL for anything of the group still left once the leader is gone (no orphans).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["guarded_command", "signal_group", "stop_group"]

_PARENT_GUARD = Path(__file__).with_name("parent_guard.py")


def signal_group(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process group led by ``pid``; False when the group is gone."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(process: subprocess.Popen[bytes], timeout: float = 5.0) -> int | None:
    """SIGTERM the group of ``process``, wait up to ``timeout`` s, then SIGKILL the group.

    Blocks (run it with ``asyncio.to_thread`` from a coroutine). Returns the exit status.
    """
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if process.poll() is None:
            signal_group(process.pid, signal.SIGKILL)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    # children that outlived their leader (or ignored SIGTERM) are still in the group
    signal_group(process.pid, signal.SIGKILL)
    return process.returncode


def guarded_command(command: list[str]) -> list[str]:
    """``command`` wrapped so that it gets SIGTERM if this process dies without stopping it.

    On Linux the wrapper sets the parent-death signal and then execs ``command`` (same pid,
    nothing stays in between). The signal is tied to the thread that forks, so the wrapper
    is used only from the main thread; elsewhere, and off Linux, ``command`` is returned as
    it is (clean-up at exit still stops it).
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return command
    return [sys.executable, "-I", "-S", str(_PARENT_GUARD), str(os.getpid()), *command]
