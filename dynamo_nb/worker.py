"""`dynamo_worker`: the decorator that gives a script's main coroutine its runtime."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .errors import ConfigError
from .notebook import in_notebook
from .runtime import DistributedRuntime

__all__ = ["dynamo_worker", "run_program", "shutdown_on_signals"]

logger = logging.getLogger("dynamo_nb.worker")

T = TypeVar("T")


def dynamo_worker(
    func: Callable[..., Awaitable[T]] | None = None,
    *,
    discovery: str | None = None,
    request_plane: str | None = None,
    nats_url: str | None = None,
    handle_signals: bool = True,
    **create_kwargs: Any,
) -> Any:
    """Decorate ``async def main(runtime, ...)``: the runtime is created and passed first.

    Arguments left out come from ``DYN_NB_DISCOVERY``, ``DYN_NB_REQUEST_PLANE`` and
    ``DYN_NB_NATS_URL``, else the `DistributedRuntime.create` defaults. In a script, SIGINT
    and SIGTERM shut the runtime down (so ``serve_endpoint`` returns); the runtime is shut
    down when the function returns or raises.

    Example:
        >>> @dynamo_worker(discovery="memory")
        ... async def main(runtime):
        ...     return runtime.connection_id > 0
        >>> import asyncio; asyncio.run(main())
        True
    """

    def decorate(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            runtime = await DistributedRuntime.create(
                discovery or os.environ.get("DYN_NB_DISCOVERY", "memory"),
                request_plane or os.environ.get("DYN_NB_REQUEST_PLANE") or None,
                nats_url or os.environ.get("DYN_NB_NATS_URL") or None,
                **create_kwargs,
            )
            remove = shutdown_on_signals(runtime) if handle_signals else _nothing
            try:
                return await fn(runtime, *args, **kwargs)
            finally:
                remove()
                await runtime.shutdown()

        return wrapper

    return decorate(func) if func is not None else decorate


def _nothing() -> None:
    return None


def shutdown_on_signals(*runtimes: DistributedRuntime) -> Callable[[], None]:
    """Make SIGINT and SIGTERM shut ``runtimes`` down; returns a function that undoes it.

    Pass every runtime of the process in one call (a later call replaces the handlers).
    Does nothing inside a Jupyter kernel or outside the main thread.

    Example:
        >>> remove = shutdown_on_signals(runtime)   # doctest: +SKIP
        >>> await runtime.wait_closed()             # returns after Ctrl-C or `kill PID`
    """
    if in_notebook() or threading.current_thread() is not threading.main_thread():
        return _nothing
    loop = asyncio.get_running_loop()
    installed = []
    shutting_down: set[asyncio.Task[None]] = set()

    def on_signal(signum: int) -> None:
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        for runtime in runtimes:
            if not runtime.is_shutdown:
                task = loop.create_task(runtime.shutdown())
                shutting_down.add(task)
                task.add_done_callback(shutting_down.discard)

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def remove() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)

    return remove


def run_program(main: Callable[[], Awaitable[int]]) -> int:
    """Run a component's ``async def main()`` as a program: a `ConfigError` is one line and exit 2.

    Example::

        if __name__ == "__main__":
            sys.exit(run_program(main))
    """
    import sys

    try:
        return asyncio.run(main())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
