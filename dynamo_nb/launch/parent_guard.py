"""Exec a command with the signal dispositions of a terminal, and (Linux) SIGTERM when the
process that launched it dies.

Run as a script, not imported: ``python -I -S parent_guard.py PARENT_PID command...``.
It puts SIGINT and SIGQUIT back to their defaults (and SIGPIPE and SIGXFSZ, which this Python
ignores as every Python does), sets ``PR_SET_PDEATHSIG`` (kept across
exec) and checks the parent is still the launcher, then replaces itself with the command, so
the command keeps this pid. ``PARENT_PID`` 0 skips the parent-death signal (where it cannot be
tied to the launcher: off Linux, or from a thread other than the main one).

Why the dispositions: an ignored signal stays ignored across ``fork`` and ``exec``, and the
launcher often ignores SIGINT (a Jupyter kernel does, and so does every background job of a
non-interactive shell, such as ``python -m pytest &`` in a script). A Python program that starts
with SIGINT ignored never turns Ctrl-C into ``KeyboardInterrupt``, so a launched client or worker
that relies on it (as Dynamo's programs do) would outlive every SIGINT. A launched program sits
in a process group of its own, so a terminal's Ctrl-C meant for the launcher never reaches it.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, command = int(sys.argv[1]), sys.argv[2:]
    for name in ("SIGINT", "SIGQUIT", "SIGPIPE", "SIGXFSZ"):  # Python itself ignores the last two
        if hasattr(signal, name):
            signal.signal(
                getattr(signal, name), signal.SIG_DFL
            )  # what a program started from a terminal gets
    if parent:
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
