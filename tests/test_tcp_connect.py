"""The TCP request plane's connect: a request on a connection that closed meanwhile fails at
once; a failed connect that every caller gave up on (cancelled while
it was connecting) is still read, so asyncio logs no "Task exception was never retrieved" (a
frontend whose prefill worker died used to log one with a traceback)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from helpers import free_port

from dynamo_nb.runtime.instance import Instance
from dynamo_nb.runtime.planes.channel import StreamChannel
from dynamo_nb.runtime.planes.tcp import TcpPlane
from dynamo_nb.runtime.planes.wire import request_tail
from dynamo_nb.runtime.security import MAGIC, PlaneSecurity


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


async def test_a_request_on_a_connection_that_just_closed_fails_at_once() -> None:
    """A connection can close after its connect returned and before its caller sends (a worker
    that asks for a cluster secret this process lacks closes it on its first bytes): the request
    fails with the reason instead of waiting for an answer that never comes."""

    greet, dropped = asyncio.Event(), asyncio.Event()

    async def greet_with_a_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await greet.wait()  # after the client's connect returned
        writer.write(MAGIC + bytes(32))  # what a worker started with a cluster secret sends first
        await writer.drain()
        await reader.read()
        dropped.set()
        writer.close()

    server = await asyncio.start_server(greet_with_a_handshake, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    worker = Instance("ns", "comp", "generate", 7, {"kind": "tcp", "address": address, "target": "t"})
    plane = TcpPlane(security=PlaneSecurity())
    try:
        conn = await plane._connection(worker)
        assert not conn.closed
        greet.set()
        await asyncio.wait_for(dropped.wait(), 60)  # the hello made the client close it
        assert conn.closed
        with pytest.raises(ConnectionError, match="requires the cluster secret"):
            conn.open(StreamChannel(worker), request_tail("t", "r1", {}, None))
        assert not conn.streams  # nothing left waiting
        assert await asyncio.wait_for(conn.ping("t"), 1) is False
    finally:
        await plane.close()
        server.close()
