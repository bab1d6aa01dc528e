"""A kit program with a CPU-time sampler inside: where its CPU goes, for `frontend_stages.py`.

``ITIMER_PROF`` asks the kernel for a signal each time the process has used a tick of CPU (4 ms
here, ``CONFIG_HZ=250``): it fires only at a moment the process runs, never while it waits. The
handler takes the main thread's Python stack at that moment and adds to it the CPU the main
thread used since the sample before (`time.thread_time`, the scheduler's precise count): the
stacks' totals are the main thread's CPU, each interval given to the stack found at its end, as
a sampling profiler does. A C call (tokenizers' Rust, a system call) is counted in the Python
frame that made it. No stack is lost to a reader racing the interpreter, and none is an idle
moment. (Counted one per signal instead, the ticks overstate a process that runs in short bursts
by a quarter to two fifths against the kernel's own precise count: tick hits are not uniform in
its run time.)

``SIGUSR1`` writes the stacks since the last ``SIGUSR1`` to OUTPUT in py-spy's raw format
(``outermost;…;innermost count`` a line, each frame ``function (file)``, the count in µs of CPU;
written whole, then renamed) and starts anew; its last line, ``# main_thread_ns process_ns``, is
the CPU of the main thread and of the whole process over the same window, since only the main
thread's stacks are sampled.

    python benchmarks/_cpu_sampler.py OUTPUT run --in http ...   # then python -m dynamo_nb's arguments
"""

from __future__ import annotations

import collections
import dis
import os
import signal
import sys
import time
from pathlib import Path
from types import CodeType, FrameType

TICK = 0.004
"""Seconds of CPU between samples: one scheduler tick at ``CONFIG_HZ=250`` (a shorter interval
still fires only at ticks)."""


RESUME = dis.opmap.get("RESUME")  # Python 3.11 and later
LOOP_FILES = ("asyncio/runners.py", "asyncio/events.py", "uvloop/__init__.py")
"""Where the frames that run the event loop are (asyncio's runner, its callback handle, uvloop's
`run`): a callback found at its first instruction (``RESUME``) just above one of them was entered
from the loop's C code (uvloop's, or asyncio's C tasks) after the tick came, which the interpreter
handles only when Python runs again: that tick is the loop's."""


def _entered_from_the_loop(frame: FrameType) -> bool:
    """Whether ``frame`` is at its first instruction just above a frame that runs the loop."""
    caller = frame.f_back
    return (
        caller is not None
        and caller.f_code.co_filename.endswith(LOOP_FILES)
        and frame.f_code.co_code[frame.f_lasti] == RESUME
    )


def main() -> int:
    output, *argv = sys.argv[1:]
    counts: collections.Counter[tuple[CodeType, ...]] = collections.Counter()  # µs of CPU per stack
    used = [time.thread_time_ns()]  # the main thread's CPU at the last sample
    started = [used[0], time.process_time_ns()]  # the main thread's and the process's, at the last write

    def tick(signum: int, frame: FrameType | None) -> None:
        if frame is not None and _entered_from_the_loop(frame):
            frame = frame.f_back  # the tick came in the loop's C code
        codes = []
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        now = time.thread_time_ns()
        counts[tuple(codes)] += (now - used[0]) // 1000
        used[0] = now

    def write(signum: int, frame: FrameType | None) -> None:
        taken = counts.copy()  # one C call: a tick's handler cannot run inside it
        counts.clear()
        now = [time.thread_time_ns(), time.process_time_ns()]  # the handler runs in the main thread
        lines = [
            ";".join(
                f"{getattr(code, 'co_qualname', code.co_name)} ({code.co_filename})"
                for code in reversed(codes)
            )
            + f" {count}"
            for codes, count in taken.items()
        ]
        lines.append(f"# {now[0] - started[0]} {now[1] - started[1]}")
        started[:] = now
        used[0] = now[0]
        part = Path(output + ".part")
        part.write_text("\n".join(lines) + "\n")
        os.replace(part, output)

    signal.signal(signal.SIGPROF, tick)
    signal.signal(signal.SIGUSR1, write)
    signal.setitimer(signal.ITIMER_PROF, TICK, TICK)
    from dynamo_nb.__main__ import main as kit

    return kit(argv)


if __name__ == "__main__":
    sys.exit(main())
