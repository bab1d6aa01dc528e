"""Exec a command that gets SIGTERM when the process that launched it dies (Linux).

Run as a script, not imported: ``python -I -S parent_guard.py PARENT_PID command...``.
It sets ``PR_SET_PDEATHSIG`` (kept across exec), checks the parent is still the launcher,
then replaces itself with the command, so the command keeps this pid.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, command = int(sys.argv[1]), sys.argv[2:]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no prctl: the launcher's clean-up at exit still stops the command
    if os.getppid() != parent:  # the launcher died before the signal was set
        sys.exit(1)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"error: cannot run {command[0]}: {exc}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main()
