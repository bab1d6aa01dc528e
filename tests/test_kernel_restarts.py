"""A notebook kernel that dies in any way leaves nothing running (real kernels).

Processes launched from a kernel are recorded with the kernel's reaper and in a state file
(`dynamo_nb.launch.ledger`). A kernel SIGKILLed from outside: its reaper stops what it launched
within seconds, even programs that ignore SIGTERM and their children. A kernel whose reaper was
killed too: the next kernel's first launch stops the leftovers and says so in one line.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, group_gone, pid_alive, pid_gone

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

CHATTY = ROOT / "tests" / "programs" / "chatty.py"
STUBBORN = f"{str(CHATTY)!r}, '--grandchild', '--ignore-term', '--ready-after', '0', '--lines', '0'"


def start_kernel(state: Path) -> tuple[Any, Any]:
    """A python3 kernel whose launches record their state under ``state``."""
    import jupyter_client

    return jupyter_client.manager.start_new_kernel(
        kernel_name="python3", env={**os.environ, "DYN_NB_STATE_DIR": str(state)}
    )


def run(kernel: Any, code: str) -> tuple[str, str]:
    """Run ``code`` in the kernel; (its stdout, its stderr)."""
    messages: list[dict[str, Any]] = []
    reply = kernel.execute_interactive(code, timeout=60, output_hook=messages.append)
    assert reply["content"]["status"] == "ok", messages
    streams = {"stdout": "", "stderr": ""}
    for message in messages:
        if message["msg_type"] == "stream":
            streams[message["content"]["name"]] += message["content"]["text"]
    return streams["stdout"], streams["stderr"]


LAUNCH_STUBBORN = (
    "import os, dynamo_nb\n"
    "from dynamo_nb.launch.ledger import ledger\n"
    f"proc = await dynamo_nb.launch({STUBBORN}, show_logs=False)\n"
    "print(os.getpid(), proc.pid, proc.logs()[0].split()[1], ledger().reaper.pid)"
)


def state_files(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".json"))


def shut_down(manager: Any, kernel: Any) -> None:
    kernel.stop_channels()
    if manager.is_alive():
        manager.shutdown_kernel(now=True)


@pytest.mark.long  # slow: CI's opt-in step runs it (the README suite keeps under 15 min)
async def test_a_sigkilled_kernel_leaves_no_process_behind(tmp_path: Path) -> None:
    manager, kernel = start_kernel(tmp_path)
    try:
        printed, _ = run(kernel, LAUNCH_STUBBORN)
        kernel_pid, pid, grandchild, reaper = map(int, printed.split())
        (state,) = state_files(tmp_path)
        assert state.startswith(f"{kernel_pid}-")  # its pid and start time
        os.kill(kernel_pid, signal.SIGKILL)  # from outside, as the OOM killer or `kill -9` would
        # both ignore SIGTERM: the reaper's SIGKILL after its grace stops them
        assert await group_gone(pid, timeout=10) and await pid_gone(grandchild, timeout=5)
        assert await pid_gone(reaper, timeout=5)
        assert state_files(tmp_path) == []  # the reaper removed the state file
    finally:
        shut_down(manager, kernel)


@pytest.mark.long  # slow: CI's opt-in step runs it (the README suite keeps under 15 min)
async def test_a_new_kernel_stops_what_a_dead_kernel_and_its_reaper_left(tmp_path: Path) -> None:
    manager, kernel = start_kernel(tmp_path)
    try:
        printed, _ = run(kernel, LAUNCH_STUBBORN)
        kernel_pid, pid, grandchild, reaper = map(int, printed.split())
        os.kill(reaper, signal.SIGKILL)
        os.kill(kernel_pid, signal.SIGKILL)
        assert await pid_gone(kernel_pid)
    finally:
        shut_down(manager, kernel)
    assert pid_alive(pid) and pid_alive(grandchild)  # they ignored the parent-death SIGTERM: left over

    manager, kernel = start_kernel(tmp_path)
    try:
        launch_again = (
            f"proc = await dynamo_nb.launch({str(CHATTY)!r}, '--ready-after', '0', show_logs=False)"
        )
        _, said = run(kernel, "import dynamo_nb\n" + launch_again)
        assert said.strip() == (
            f"dynamo_nb: stopped 1 process group(s) left running by dead process(es) {kernel_pid}: "
            f"chatty (pid {pid})"
        ), said
        # SIGKILLed already; their zombies wait for init to reap them
        assert await group_gone(pid, timeout=5) and await pid_gone(grandchild, timeout=5)
        assert not any(name.startswith(f"{kernel_pid}-") for name in state_files(tmp_path))
        printed, said = run(kernel, launch_again + "\nprint(proc.pid)")  # only the first launch looks
        assert said == ""
    finally:
        shut_down(manager, kernel)  # SIGKILLs the kernel's process group: its reaper is not in it
    assert await group_gone(int(printed), timeout=10)
