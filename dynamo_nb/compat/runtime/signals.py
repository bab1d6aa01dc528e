"""What SIGTERM does to a Dynamo-shaped program: it ends the process, as on Dynamo, after the
runtime has left discovery.

Dynamo's runtime installs no signal handler: Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM
ends the process at once, its registrations staying in discovery until their lease expires.
Here Ctrl-C is left alone (``dynamo_worker`` shuts the runtime down as the interrupt unwinds),
and SIGTERM, when the program has no handler of its own, first deregisters the runtime's
endpoints (for at most `DEREGISTER_TIMEOUT` seconds) and then ends the process by SIGTERM, so
callers never route to a worker that is gone. A handler the program installed (``signal.signal``
or ``loop.add_signal_handler``, before or after) is never replaced.

Example::

    end_on_sigterm(runtime)     # after connecting; does nothing in a notebook kernel
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

from ...jupyter import in_notebook
from ...runtime import DistributedRuntime

__all__ = ["DEREGISTER_TIMEOUT", "end_on_sigterm"]

DEREGISTER_TIMEOUT = 1.0
"""Seconds SIGTERM waits for the runtime to leave discovery before the process ends."""

_pending: set[asyncio.Task[None]] = set()  # held: a bare task may be collected


def end_on_sigterm(runtime: DistributedRuntime) -> bool:
    """On SIGTERM, shut ``runtime`` down, then end the process by SIGTERM; True when installed
    (not in a notebook kernel, not off the main thread, not over a handler of the program's)."""
    if in_notebook() or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False  # the program handles SIGTERM itself
    loop = asyncio.get_running_loop()

    async def deregister_then_end() -> None:
        try:
            with contextlib.suppress(Exception):  # the process ends whatever happened
                await asyncio.wait_for(runtime.shutdown(), DEREGISTER_TIMEOUT)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def on_sigterm() -> None:
        task = loop.create_task(deregister_then_end())
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    return True
