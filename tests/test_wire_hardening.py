"""Hostile input on the wire: garbage, truncated and oversized frames sent to a TCP
request-plane port or a bootstrap server close that connection only (the process keeps
serving); a bootstrap room is handed out only with its token, once; every listener of a
worker and a frontend binds 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from typing import Any

import msgpack
import psutil
import pytest
from helpers import FRONTEND, HF_WORKER, RuntimeFactory, collect, free_port

from dynamo_nb import DisaggregationError
from dynamo_nb.disagg import BootstrapInfo, BootstrapServer, draw_room, draw_token, fetch_kv
from dynamo_nb.runtime.planes.wire import MAX_FRAME_BYTES, REQUEST, encode_prefixed

pytestmark = pytest.mark.timeout(120)

PREFIX = struct.Struct(">I")


async def words(request: Any) -> Any:
    for word in request["text"].split():
        yield {"word": word}


async def closed_by_peer(host: str, port: int, data: bytes, timeout: float = 5.0) -> bool:
    """Send ``data`` on a new connection; whether the peer then closes it (EOF within ``timeout``)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        try:
            while await asyncio.wait_for(reader.read(65536), timeout):
                pass  # e.g. an error frame first
        except ConnectionResetError:
            pass
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        writer.close()


def frame(value: Any) -> bytes:
    body = msgpack.packb(value)
    return PREFIX.pack(len(body)) + body


async def test_garbage_on_a_tcp_request_plane_port_closes_that_connection_only(
    make_runtime: RuntimeFactory,
) -> None:
    server_rt, client_rt = await make_runtime("memory-tcp"), await make_runtime("memory-tcp")
    server = await server_rt.endpoint("test.hostile.generate").serve(words)
    host, port = server.address.removeprefix("tcp://").rsplit(":", 1)
    client = await client_rt.endpoint("test.hostile.generate").client()
    await client.wait_for_instances(timeout=10)

    hostile = {
        "random bytes": PREFIX.pack(64) + random.Random(7).randbytes(64),
        "not a list": frame(42),
        "an oversized frame": PREFIX.pack(MAX_FRAME_BYTES + 1) + b"\x00" * 64,
        "not msgpack": PREFIX.pack(4) + b"\xc1\xc1\xc1\xc1",
        "an unhashable target": frame([REQUEST, 1, ["not", "a", "target"], "rid", {}]),
        "an unhashable stream id": frame([REQUEST + 1, {"sid": 1}]),
        "a request with seven fields": frame([REQUEST, 1, "test.hostile.generate", "rid", {}, {}, "extra"]),
    }
    for what, data in hostile.items():
        assert await closed_by_peer(host, int(port), data), what
    # a truncated frame: the server waits for the rest; the sender leaves; nothing breaks
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(PREFIX.pack(1000) + b"\x93\x00")
    await writer.drain()
    writer.close()
    # a well-formed request for a target not served here gets an error frame, not a crash
    assert (
        await closed_by_peer(host, int(port), encode_prefixed((REQUEST, 7, "no.such.target", "r", {})), 0.5)
        is False
    )

    assert await collect(client.round_robin({"text": "still serving"})) == [
        {"word": "still"},
        {"word": "serving"},
    ]
    for _ in range(100):  # the hostile connections are gone; the good client's is left
        if len(server_rt.request_plane._server_conns) == 1:
            break
        await asyncio.sleep(0.02)
    assert len(server_rt.request_plane._server_conns) == 1


async def test_a_bootstrap_room_goes_only_to_its_token_and_only_once() -> None:
    server = await BootstrapServer.start(ttl=30)
    try:
        room, token = draw_room(), draw_token()
        header = {"format": "dynamo_nb.kv.v1", "prompt_tokens": 3, "payload_bytes": 4}
        server.park(room, header, b"\x01\x02\x03\x04", token)
        with pytest.raises(DisaggregationError, match="wrong or missing bootstrap_token"):
            await fetch_kv(BootstrapInfo(server.host, server.port, room), timeout=1)
        with pytest.raises(DisaggregationError, match="wrong or missing bootstrap_token"):
            await fetch_kv(BootstrapInfo(server.host, server.port, room, draw_token()), timeout=1)
        assert server.parked == 1  # refused fetches leave the room for its decode
        got, payload = await fetch_kv(BootstrapInfo(server.host, server.port, room, token), timeout=1)
        assert payload == b"\x01\x02\x03\x04" and got["prompt_tokens"] == 3
        with pytest.raises(DisaggregationError, match="no KV cache for room"):  # handed out once
            await fetch_kv(BootstrapInfo(server.host, server.port, room, token), timeout=0.3)
        assert server.served_total == 1
        # a failed prefill's reason also goes only to the token's holder
        failed = draw_room()
        server.fail(failed, "boom", token)
        with pytest.raises(DisaggregationError, match="wrong or missing"):
            await fetch_kv(BootstrapInfo(server.host, server.port, failed), timeout=1)
        with pytest.raises(DisaggregationError, match="the prefill failed: boom"):
            await fetch_kv(BootstrapInfo(server.host, server.port, failed, token), timeout=1)
    finally:
        await server.stop()


async def test_garbage_to_a_bootstrap_server_closes_that_connection_only() -> None:
    server = await BootstrapServer.start(ttl=30)
    try:
        deep = b"[" * 50_000 + b"]" * 50_000
        hostile = {
            "random bytes": PREFIX.pack(200) + random.Random(7).randbytes(200),
            "an oversized header": PREFIX.pack(1 << 30) + b"{}",
            "not JSON": PREFIX.pack(5) + b"\xff\xfe{[(",
            "JSON that is not an object": PREFIX.pack(2) + b"[]",
            "too deeply nested JSON": PREFIX.pack(len(deep)) + deep,
            "a room that is not an int": PREFIX.pack(14) + json.dumps({"room": "1"}).encode().ljust(14),
        }
        for what, data in hostile.items():
            assert await closed_by_peer(server.host, server.port, data), what
        room, token = draw_room(), draw_token()
        server.park(room, {"format": "x", "payload_bytes": 0}, b"", token)
        got, _ = await fetch_kv(BootstrapInfo(server.host, server.port, room, token), timeout=1)
        assert got["format"] == "x"  # still serving
    finally:
        await server.stop()


def listening(pid: int) -> list[tuple[str, int]]:
    """The (address, port) pairs process ``pid`` listens on (TCP)."""
    return [
        (conn.laddr.ip, conn.laddr.port)
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    ]


async def test_workers_and_frontend_listen_on_127_0_0_1_only(services: Any, start_worker: Any) -> None:
    etcd = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    endpoints = ["--endpoint", "bind.backend.generate", "--prefill-endpoint", "bind.prefill.generate"]
    prefill = await start_worker(
        *etcd, *endpoints, "--mode", "prefill", "--request-plane", "tcp", script=HF_WORKER
    )
    decode = await start_worker(*etcd, *endpoints, "--mode", "decode", "--system-port", "0", script=HF_WORKER)
    frontend = await start_worker(*etcd, "--http-port", str(free_port()), script=FRONTEND)
    sockets = {
        role: listening(process.pid)
        for role, process in [("prefill", prefill), ("decode", decode), ("frontend", frontend)]
    }
    assert len(sockets["prefill"]) >= 2, sockets  # its TCP request plane and its bootstrap server
    assert len(sockets["decode"]) >= 1 and len(sockets["frontend"]) >= 1, sockets  # system status; HTTP
    assert {ip for pairs in sockets.values() for ip, _port in pairs} == {"127.0.0.1"}, sockets
