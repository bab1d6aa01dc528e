"""Child processes in their own process group: start, signal and stop the whole group.

`LocalServices` (etcd, nats-server) and `dynamo_nb.launch` (components) share these, so a
stop is the same everywhere: SIGTERM to the leader, which stops its own children (vLLM's
engine stops its engine-core process; a SIGTERM of its own would make the engine log a dead
engine's traceback), wait, SIGKILL to the group if the leader is still there; then whatever
of the group outlived its leader gets SIGTERM, a short grace, and SIGKILL (no orphans).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .ledger import ledger
from .reaper import process_start

__all__ = ["OWN_PROCESS_GROUP", "guarded_command", "pid_alive", "signal_group", "stop_group"]

OWN_PROCESS_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
)
"""``Popen`` keywords that start a child in a process group of its own, in the caller's session.

Not a new session: where Linux groups processes by session for scheduling (autogroup, the
default on many distributions and VMs), a session of its own would give every component an
equal share of the CPU whatever its nice value, so a busy child (vLLM's engine processes spin
while they wait) could take the CPU from another component's event loop for seconds. In the
caller's session nice values rank them as asked; the group still lets a stop reach every child,
and a terminal's Ctrl-C reaches only the foreground group."""

_PARENT_GUARD = Path(__file__).with_name("parent_guard.py")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux ``/proc``); a zombie waiting for its reaper counts as gone.

    Example:
        >>> pid_alive(os.getpid())
        True
    """
    return process_start(pid) is not None


def signal_group(pid: int, signum: int) -> bool:
    """Send ``signum`` to the process group led by ``pid``; False when the group is gone."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


LEFTOVER_GRACE_S = 1.0
"""Seconds the group's processes that outlived their leader get between SIGTERM and SIGKILL."""


def stop_group(process: subprocess.Popen[bytes], timeout: float = 5.0) -> int | None:
    """SIGTERM the leader ``process``, wait up to ``timeout`` s for it, SIGKILL the group if it
    is still there; then what is left of the group: SIGTERM, `LEFTOVER_GRACE_S`, SIGKILL. The
    group leaves this process's ledger (`dynamo_nb.launch.ledger`): nothing is left to reap.

    Blocks (run it with ``asyncio.to_thread`` from a coroutine). Returns the leader's exit status.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if process.poll() is None:
            signal_group(process.pid, signal.SIGKILL)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    # children that outlived their leader (or ignored their leader's stop) are still in the group
    if signal_group(process.pid, signal.SIGTERM):
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while signal_group(process.pid, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
    signal_group(process.pid, signal.SIGKILL)
    ledger().forget(process.pid)
    return process.returncode


def guarded_command(command: list[str]) -> list[str]:
    """``command`` wrapped so that it starts with SIGINT and SIGQUIT at their defaults (as from a
    terminal, also where this process ignores them: a Jupyter kernel, a background job of a
    script) and gets SIGTERM if this process dies without stopping it.

    The wrapper (``parent_guard.py``) resets the two signals, on Linux sets the parent-death
    signal, and then execs ``command`` (same pid, nothing stays in between). The parent-death
    signal is tied to the thread that forks, so it is set only from the main thread on Linux;
    elsewhere clean-up at exit still stops the command.

    Example:
        >>> guarded_command(["etcd"])[-1], guarded_command(["etcd"])[2]
        ('etcd', '-S')
    """
    guard = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
    return [sys.executable, "-I", "-S", str(_PARENT_GUARD), str(os.getpid() if guard else 0), *command]
