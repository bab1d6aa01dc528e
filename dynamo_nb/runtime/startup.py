"""Waiting for etcd and NATS at start-up, so components may start in any order.

In a graph, or in Kubernetes where pods start in any order, a worker may start before etcd or
NATS answers. `wait_for_service` keeps trying a connection until a deadline: one log line when
it starts waiting, one when it is connected, and the last error (with its advice) when the
deadline passes. Components wait ``--connect-timeout`` seconds (default 60; Dynamo waits up to
120 s for etcd); the Python API's default is 5 s, so a notebook cell fails fast.

Example::

    client = await wait_for_service(lambda timeout: connect(url, timeout), what="etcd", url=url, timeout=60)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import ServiceUnavailableError

__all__ = ["ATTEMPT_SECONDS", "wait_for_service"]

logger = logging.getLogger("dynamo_nb.startup")

T = TypeVar("T")

ATTEMPT_SECONDS = 5.0
"""The longest one connection attempt may take (a service that accepts but does not answer)."""

_PAUSES = (0.1, 0.2, 0.5, 1.0)


async def wait_for_service(
    attempt: Callable[[float], Awaitable[T]], *, what: str, url: str, timeout: float
) -> T:
    """``await attempt(seconds)`` until it returns, for at most ``timeout`` seconds in all.

    ``attempt`` gets the seconds it may take and raises `ServiceUnavailableError` when the
    service does not answer; other errors end the wait at once.

    Raises:
        ServiceUnavailableError: the last attempt's error, once ``timeout`` has passed.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout
    tries = 0
    while True:
        remaining = deadline - loop.time()
        try:
            result = await attempt(max(0.1, min(ATTEMPT_SECONDS, remaining)))
        except ServiceUnavailableError as exc:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise
            if tries == 0:
                logger.warning(
                    "waiting for %s at %s (%s); retrying for up to %.0f s",
                    what,
                    url,
                    exc.args[0].split(". ")[0],
                    remaining,
                )
            pause = _PAUSES[min(tries, len(_PAUSES) - 1)]
            tries += 1
            await asyncio.sleep(min(pause, remaining))
            continue
        if tries:
            logger.warning("connected to %s at %s after %.1f s", what, url, loop.time() - started)
        return result
