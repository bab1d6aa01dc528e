"""Stop what a process launched once that process is gone, however it died (Linux, stdlib only).

Run as a script, not imported: ``python -I -S reaper.py OWNER_PID STATE_FILE``, in a process
group of its own, with a pipe from the owner on stdin. The owner writes ``+PGID START`` when it
launches a process group (START: its leader's start time, `process_start`) and ``-PGID`` when
it has stopped one. When the pipe closes or the
owner is no longer this process's parent (the owner exited, was SIGKILLed, or a notebook kernel
was restarted), every group still recorded (and still the one recorded: a reused id is never signalled) gets SIGTERM, `GRACE_S` seconds, then SIGKILL; then
the owner's state file is removed and the reaper exits. A clean exit has stopped and removed
every group first, so the reaper then has nothing to do.
"""

import os
import select
import signal
import sys
import time
from typing import Any

GRACE_S = 3.0


def process_start(pid: int) -> "int | None":  # quoted: this runs without site, on any 3.x
    """When process ``pid`` started (clock ticks since boot, ``/proc``); None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def still_the_group(pgid: int, start: "int | None") -> bool:
    """Whether group ``pgid`` is still the one whose leader started at ``start``: that leader, or
    (the leader gone) members left in the group, which keeps its id from being reused."""
    now = process_start(pgid)
    return now == start if now is not None else group_alive(pgid)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process left."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(recorded: dict) -> None:
    """SIGTERM every group of ``recorded`` (pgid → leader start) that is still the one recorded,
    wait up to `GRACE_S` seconds for them together, SIGKILL what is left."""
    groups = {pgid: start for pgid, start in recorded.items() if still_the_group(pgid, start)}
    for pgid in groups:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(group_alive(pgid) for pgid in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid, start in groups.items():
        if still_the_group(pgid, start):  # checked again: the id may be another group's by now
            _signal(pgid, signal.SIGKILL)


def _read_commands(groups: dict, pending: bytes) -> "tuple[bool, bytes]":  # stdin still open, the rest
    """Apply the ``+PGID START`` / ``-PGID`` lines waiting on stdin."""
    data = os.read(0, 65536)
    if not data:
        return False, b""
    *lines, rest = (pending + data).split(b"\n")
    for line in lines:
        words = line.decode(errors="replace").split()
        if len(words) == 2 and words[0][:1] == "+" and words[0][1:].isdigit() and words[1].isdigit():
            groups[int(words[0][1:])] = int(words[1])
        elif len(words) == 1 and words[0][:1] == "-" and words[0][1:].isdigit():
            groups.pop(int(words[0][1:]), None)
    return True, rest


def main() -> None:
    owner, state_file = int(sys.argv[1]), sys.argv[2]
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the owner's end stops this
    groups: dict[str, Any] = {}
    pending = b""
    open_pipe = True
    while open_pipe and os.getppid() == owner:
        if select.select([0], [], [], 0.5)[0]:
            open_pipe, pending = _read_commands(groups, pending)
    while open_pipe and select.select([0], [], [], 0)[0]:  # what the owner wrote before it died
        open_pipe, pending = _read_commands(groups, pending)
    stop_groups(groups)
    try:
        os.unlink(state_file)
    except OSError:
        pass


if __name__ == "__main__":
    main()
