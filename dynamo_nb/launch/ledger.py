"""What this process launched, kept where it outlives the process (Linux).

Every process group `launch` or `LocalServices` starts is recorded twice:

- with this process's **reaper** (``reaper.py``, started with the first group, in a process
  group of its own): when this process dies in any way (a notebook kernel killed or restarted,
  SIGKILL included), the reaper stops every group still recorded within a few seconds;
- in a **state file**, ``<tempdir>/dynamo_nb-<uid>/launched/<pid>-<start>.json``, with each group's
  name, command, log and start time. If the reaper could not do its job (it was killed too),
  the next process's first `launch` finds the groups of dead owners there and stops them,
  saying so in one line (`settle_leftovers`), or `dynamo_nb.launch.adopt_leftovers` takes
  them over.

A process id is trusted only with the start time recorded for it, so a reused id is never
signalled.

Example::

    leftovers()  # groups left running by processes that are gone
    # [Leftover(pid=4242, name='hf_worker', command=[...], log_path='...', owner=4200, start=...)]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .reaper import GRACE_S, process_start, still_the_group, stop_groups

__all__ = [
    "Leftover",
    "ledger",
    "leftovers",
    "mark_settled",
    "process_start",
    "release",
    "settle_leftovers",
    "settle_leftovers_once",
    "settled",
    "state_folder",
]

_REAPER = Path(__file__).with_name("reaper.py")


def state_folder() -> Path:
    """Where owners' state files live (``$DYN_NB_STATE_DIR``, else a per-user temp folder),
    checked to be this user's own: nobody else may plant a state file that makes a launch
    signal processes of their choosing."""
    configured = os.environ.get("DYN_NB_STATE_DIR")
    user = Path(tempfile.gettempdir()) / f"dynamo_nb-{os.getuid()}"
    base = Path(configured) if configured else user / "launched"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (base,) if configured else (user, base):
        status = folder.lstat()
        if stat.S_ISLNK(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o022:
            raise ConfigError(
                f"{folder} is not a folder of this user's that only it may write (a link, another "
                "user's, or writable by others): remove it, or set DYN_NB_STATE_DIR to a private folder"
            )
    return base


@dataclass(frozen=True)
class Leftover:
    """A process group a dead owner launched that still runs.

    Attributes:
        pid: its leader's pid (the group id).
        name, command, log_path: as the owner launched it.
        owner: the dead owner's pid.
        start: its leader's start time as recorded (`process_start`).
        state_file: the dead owner's state file it was found in.
    """

    pid: int
    name: str
    command: list[str]
    log_path: str
    owner: int
    start: int | None
    state_file: str = ""


class _Ledger:
    """This process's groups: its state file and its reaper."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.start = process_start(self.pid)
        self.path = state_folder() / f"{self.pid}-{self.start}.json"  # a reused pid: another file
        self.groups: dict[int, dict[str, Any]] = {}
        self.reaper: subprocess.Popen[bytes] | None = None
        self.reaper_start: int | None = None
        self.lock = threading.Lock()

    def record(
        self, pid: int, name: str, command: list[str], log_path: str, start: int | None = None
    ) -> None:
        """Record group ``pid`` (its leader's ``start`` time: measured now unless given)."""
        with self.lock:
            self.groups[pid] = {
                "name": name,
                "command": command,
                "log": log_path,
                "start": start if start is not None else process_start(pid),
            }
            self._tell(f"+{pid} {self.groups[pid]['start']}")
            self._save()  # after: a reaper started just now is in it

    def forget(self, pid: int) -> None:
        with self.lock:
            if self.groups.pop(pid, None) is None:
                return
            self._tell(f"-{pid}")
            self._save()

    def _save(self) -> None:
        if not self.groups:
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        state = {
            "owner": self.pid,
            "owner_start": self.start,
            "argv": sys.argv[:3],
            "reaper": self.reaper.pid if self.reaper is not None else None,
            "reaper_start": self.reaper_start,
            "groups": {str(pid): group for pid, group in self.groups.items()},
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(self.path)

    def _tell(self, line: str) -> None:
        """Send ``line`` to the reaper, starting one (told every group) if there is none."""
        if sys.platform != "linux":
            return
        if self.reaper is None or self.reaper.poll() is not None:
            self._start_reaper()
            if line.startswith("+"):
                return  # the new reaper was told every group
        self._write(line + "\n")

    def _start_reaper(self) -> None:
        self.reaper = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_REAPER), str(self.pid), str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a kernel restart kills the kernel's process group: not this
        )
        self.reaper_start = process_start(self.reaper.pid)
        self._write("".join(f"+{pid} {group['start']}\n" for pid, group in self.groups.items()))

    def _write(self, text: str) -> None:
        if self.reaper is None or self.reaper.stdin is None or not text:
            return
        try:
            self.reaper.stdin.write(text.encode())
            self.reaper.stdin.flush()
        except (BrokenPipeError, ValueError):
            self.reaper = None


_LEDGER: _Ledger | None = None
_SETTLING = threading.Lock()
_SETTLED: set[int] = set()  # pids of the processes (this one, after forks) that settled leftovers


def ledger() -> _Ledger:
    """This process's ledger (a forked child gets its own)."""
    global _LEDGER
    if _LEDGER is None or _LEDGER.pid != os.getpid():
        _LEDGER = _Ledger()
    return _LEDGER


def _owner_alive(state: dict[str, Any]) -> bool:
    owner = state.get("owner")
    return isinstance(owner, int) and process_start(owner) == state.get("owner_start")


def _dead_owners() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(state_folder().glob("*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and not _owner_alive(state):  # this process's own is alive
            found.append((path, state))
    return found


def leftovers(wait_for_reapers: float = 0.0) -> list[Leftover]:
    """Process groups that processes now gone launched and that still run; waits up to
    ``wait_for_reapers`` seconds for a dead owner's reaper that is still stopping them.

    Example::

        [leftover.name for leftover in leftovers()]
        # ['hf_worker', 'frontend']
    """
    found = []
    for path, state in _dead_owners():
        reaper, reaper_start = state.get("reaper"), state.get("reaper_start")
        deadline = time.monotonic() + wait_for_reapers
        while (
            isinstance(reaper, int)
            and reaper_start is not None
            and process_start(reaper) == reaper_start
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        groups = state.get("groups")
        groups = groups if isinstance(groups, dict) else {}
        for key, group in groups.items():
            if (
                not key.isdigit()
                or not isinstance(group, dict)
                or not still_the_group(int(key), group.get("start"))
            ):
                continue
            found.append(
                Leftover(
                    pid=int(key),
                    name=str(group.get("name", "?")),
                    command=[str(part) for part in group.get("command", [])],
                    log_path=str(group.get("log", "")),
                    owner=int(state["owner"]),
                    start=group.get("start"),
                    state_file=str(path),
                )
            )
        if not any(leftover.owner == state["owner"] for leftover in found):
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def release(found: list[Leftover]) -> None:
    """Remove the state files of the owners of ``found`` (their groups are handled now)."""
    for state_file in {leftover.state_file for leftover in found}:
        with contextlib.suppress(OSError):
            Path(state_file).unlink()


def settle_leftovers() -> list[Leftover]:
    """Once per process, before its first launch: stop the groups dead owners left running and
    say so in one line on stderr. Blocking (up to a few seconds; run it off the event loop).

    Example::

        settle_leftovers()
        # dynamo_nb: stopped 1 process group(s) left running by dead process(es) 4200: hf_worker (pid 4242)
        settle_leftovers()  # the second call does nothing
        # []
    """
    with _SETTLING:  # a second first launch (asyncio.gather) waits for this one
        if settled() or sys.platform != "linux":
            return []
        found = leftovers(wait_for_reapers=GRACE_S + 1.0)
        _stop_and_say(found)
        _SETTLED.add(os.getpid())
        return found


def _stop_and_say(found: list[Leftover]) -> None:
    if found:
        stop_groups({leftover.pid: leftover.start for leftover in found})
        release(found)
        owners = sorted({leftover.owner for leftover in found})
        names = ", ".join(f"{leftover.name} (pid {leftover.pid})" for leftover in found)
        print(
            f"dynamo_nb: stopped {len(found)} process group(s) left running by dead process(es) "
            f"{', '.join(map(str, owners))}: {names}",
            file=sys.stderr,
            flush=True,
        )


async def settle_leftovers_once() -> None:
    """Before this process's first launch: stop what dead kernels (or scripts) left running
    (`settle_leftovers`, one line on stderr when there was any)."""
    if not settled():
        await asyncio.to_thread(settle_leftovers)


def settled() -> bool:
    """Whether this process has settled (or adopted) the leftovers already."""
    return os.getpid() in _SETTLED


def mark_settled() -> None:
    """Leftovers are handled (adopted): the first launch must not stop them."""
    _SETTLED.add(os.getpid())
