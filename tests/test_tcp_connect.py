"""The TCP request plane's connect: a failed connect that every caller gave up on (cancelled while
it was connecting) is still read, so asyncio logs no "Task exception was never retrieved" (a
frontend whose prefill worker died used to log one with a traceback)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from helpers import free_port

from dynamo_nb.runtime.instance import Instance
from dynamo_nb.runtime.planes.tcp import TcpPlane


async def test_a_connect_nobody_awaits_any_more_fails_quietly() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    plane = TcpPlane()
    dead = Instance(
        "ns", "comp", "generate", 7, {"kind": "tcp", "address": f"127.0.0.1:{free_port()}", "target": "t"}
    )
    try:
        caller = asyncio.create_task(plane._connection(dead))
        await asyncio.sleep(0)  # the caller waits on the connect, which has not failed yet
        caller.cancel()
        await asyncio.sleep(0.3)  # the connect is refused meanwhile
        assert caller.cancelled() and not plane._connecting
        del caller
        gc.collect()
        await asyncio.sleep(0)
        assert not [c for c in reported if "never retrieved" in str(c.get("message", ""))], reported
    finally:
        loop.set_exception_handler(None)
        await plane.close()
