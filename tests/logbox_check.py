"""Whether the launch log boxes a reader sees in JupyterLab tell each process's real state.

A launched program's log box is titled ``name · pid N[ · host H] · status``; once its output closes
the status is ``exited CODE`` (it ended on its own or was killed), ``stopped`` (by ``stop``) or
``closed`` (the output closed but the process still runs). The browser test reads every title off
the page after Run All, asks the kernel which launched processes ended and how, and fails on a
title that disagrees: a killed worker shown ``closed``, or one still running shown as exited.

Example:
    >>> log_box_disagreements("worker · pid 7 · closed\\n", {7: "exited -9"})
    ["pid 7's log box says 'closed', the process exited -9"]
"""

from __future__ import annotations

import re

TITLE = re.compile(r"· pid (\d+)(?: · host [^\n·]+)? · ([^\n]+)")


def log_box_disagreements(page_text: str, ends: dict[int, str | None]) -> list[str]:
    """Each title in ``page_text`` whose status disagrees with ``ends`` (pid → how the process
    ended, ``exited CODE`` or ``stopped``; None while it runs; pids not there are not judged)."""
    problems = []
    for match in TITLE.finditer(page_text):
        pid, shown = int(match.group(1)), match.group(2).strip()
        if pid not in ends:
            continue
        how = ends[pid]
        if how is not None and shown != how:
            problems.append(f"pid {pid}'s log box says {shown!r}, the process {how}")
        elif how is None and shown.startswith(("exited", "stopped")):
            problems.append(f"pid {pid}'s log box says {shown!r}, the process still runs")
    return problems
