"""Memory per message is bounded by the message's size on every port of a worker and a frontend.

A frame of empty msgpack maps costs ~70× its size to decode, one of negative fixints ~40×, a JSON
body of empty arrays ~21×; oversized frames are refused from their length prefix. Each hostile
message goes to a real process (the prefill's TCP request plane and bootstrap server, the
decode's system status server, a worker's NATS subject, the frontend's HTTP port) and the
process's peak RSS (VmHWM, reset before each message) must stay within five times the message
(or the 8 MiB a small one may take), plus what a process's allocator moves on its own; the
processes keep serving.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import msgpack
import nats
import psutil
import pytest
from helpers import FRONTEND, HF_WORKER, MOCKER_WORKER, free_port

from dynamo_nb import DistributedRuntime
from dynamo_nb.http import fetch
from dynamo_nb.runtime.bounded_decode import decode_budget
from dynamo_nb.runtime.planes.wire import MAX_REQUEST_FRAME_BYTES, REQUEST

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not Path("/proc/self/clear_refs").exists(),
        reason="needs Linux's /proc/PID/clear_refs to reset a process's peak RSS",
    ),
]

PREFIX = struct.Struct(">I")
MB = 1 << 20
ALLOCATOR_SLACK = 4 * MB  # what a process's RSS moves by on its own between two readings


def reset_peak(pid: int) -> None:
    """Make the process's peak RSS its current RSS (Linux: ``echo 5 > /proc/PID/clear_refs``)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rise(pid: int) -> int:
    """Bytes the peak RSS rose above the current RSS since `reset_peak` (both from /proc)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return (int(fields["VmHWM"].split()[0]) - int(fields["VmRSS"].split()[0])) * 1024


def listening(pid: int) -> set[int]:
    return {
        conn.laddr.port
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }


def tcp_port_of(client: Any) -> int:
    """The TCP request-plane port of the client's one instance."""
    return int(client.instances()[0].transport["address"].rsplit(":", 1)[1])


def request_of(items: list[Any]) -> bytes:
    """A REQUEST frame whose body is ``items``."""
    return msgpack.packb([REQUEST, 1, "mem.backend.generate", "r1", items])


def empty_maps(size: int) -> bytes:
    """A REQUEST frame whose body is ~``size`` bytes of empty maps (one byte each)."""
    return request_of([{}] * size)


async def send_and_wait_for_close(port: int, data: bytes, timeout: float = 20.0) -> None:
    """Send ``data`` to 127.0.0.1:``port``; return when the peer closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        while await asyncio.wait_for(reader.read(65536), timeout):
            pass
    except ConnectionResetError:
        pass
    finally:
        writer.close()


async def measured(pid: int, send: Any) -> int:
    """Peak RSS rise of ``pid`` while ``send()`` runs (and a moment after, for the decode)."""
    await asyncio.sleep(0.2)
    reset_peak(pid)
    await send()
    await asyncio.sleep(0.5)
    return peak_rise(pid)


@pytest.mark.long  # slow: CI's opt-in step runs it (the README suite keeps under 15 min)
async def test_every_port_bounds_the_memory_a_message_costs(services: Any, start_worker: Any) -> None:
    etcd = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    endpoints = ["--endpoint", "mem.backend.generate", "--prefill-endpoint", "mem.prefill.generate"]
    prefill = await start_worker(
        *etcd, *endpoints, "--mode", "prefill", "--request-plane", "tcp", script=HF_WORKER
    )
    decode = await start_worker(*etcd, *endpoints, "--mode", "decode", "--system-port", "0", script=HF_WORKER)
    over_nats = await start_worker(
        *etcd,
        "--endpoint",
        "mem.nats.generate",
        "--request-plane",
        "nats",
        "--model-name",
        "over-nats",
        script=MOCKER_WORKER,
    )
    http_port = free_port()
    frontend = await start_worker(*etcd, "--http-port", str(http_port), script=FRONTEND)

    runtime = await DistributedRuntime.create(discovery=services.etcd_url, nats_url=services.nats_url)
    try:
        prefill_client = await runtime.endpoint("mem.prefill.generate").client()
        decode_client = await runtime.endpoint("mem.backend.generate").client()
        nats_client = await runtime.endpoint("mem.nats.generate").client()
        await prefill_client.wait_for_instances(timeout=30)
        await decode_client.wait_for_instances(timeout=30)
        await nats_client.wait_for_instances(timeout=30)
        tcp_port = tcp_port_of(prefill_client)
        (bootstrap_port,) = listening(prefill.pid) - {tcp_port}
        (status_port,) = listening(decode.pid) - {tcp_port_of(decode_client)}
        subject = nats_client.instances()[0].transport["address"]
    finally:
        await runtime.shutdown()

    rises: dict[str, tuple[int, int]] = {}  # what → (bytes sent, peak RSS rise)

    # the TCP request plane: empty maps under the request limit; a prefix over it; deep nesting
    nested = empty_maps(MAX_REQUEST_FRAME_BYTES - 1024)
    data = PREFIX.pack(len(nested)) + nested
    rises["tcp: 4 MB of empty maps"] = (
        len(data),
        await measured(prefill.pid, lambda: send_and_wait_for_close(tcp_port, data)),
    )
    negatives = request_of([-20] * (MAX_REQUEST_FRAME_BYTES - 1024))  # 28-byte ints, a byte each
    negatives_frame = PREFIX.pack(len(negatives)) + negatives
    rises["tcp: 4 MB of negative fixints"] = (
        len(negatives_frame),
        await measured(prefill.pid, lambda: send_and_wait_for_close(tcp_port, negatives_frame)),
    )
    pairs = request_of(["ab"] * ((MAX_REQUEST_FRAME_BYTES - 1024) // 3))  # a 51-byte str per 3
    pairs_frame = PREFIX.pack(len(pairs)) + pairs
    rises["tcp: 4 MB of two-character strings"] = (
        len(pairs_frame),
        await measured(prefill.pid, lambda: send_and_wait_for_close(tcp_port, pairs_frame)),
    )
    huge = PREFIX.pack(MAX_REQUEST_FRAME_BYTES + 1) + b"\x00" * (1 * MB)
    rises["tcp: a prefix over the request limit"] = (
        len(huge),
        await measured(prefill.pid, lambda: send_and_wait_for_close(tcp_port, huge)),
    )
    deep = b"\x91" * (1 * MB) + b"\xc0"
    deep_frame = PREFIX.pack(len(deep)) + deep
    rises["tcp: 1 MB of nested arrays"] = (
        len(deep_frame),
        await measured(prefill.pid, lambda: send_and_wait_for_close(tcp_port, deep_frame)),
    )

    # the bootstrap server: an ask over its limit is refused from the prefix
    ask = PREFIX.pack(64 * MB) + b"{" * (1 * MB)
    rises["bootstrap: an oversized ask"] = (
        len(ask),
        await measured(prefill.pid, lambda: send_and_wait_for_close(bootstrap_port, ask)),
    )

    # a worker's NATS subject (nats-server carries at most ~1 MB per message)
    async def publish_nested() -> None:
        nc = await nats.connect(services.nats_url)
        try:
            await nc.publish(subject, empty_maps(1000 * 1000 - 100), reply="mem.reply.inbox")
            await nc.flush()
        finally:
            await nc.close()

    rises["nats: 1 MB of empty maps"] = (1 * MB, await measured(over_nats.pid, publish_nested))

    # the frontend's HTTP port: JSON of empty arrays (under the prompt's size bound, which refuses
    # a longer body before it is decoded); the system status server: a large POST
    body = b'{"model": "x", "prompt": [' + b"[]," * (MB // 3) + b"[]]}"
    answers: dict[str, tuple[int, bytes]] = {}

    async def post(port: int, path: str, what: str, payload: bytes) -> None:
        answers[what] = await fetch(f"http://127.0.0.1:{port}{path}", method="POST", body=payload, timeout=60)

    rises["http: 1 MB of empty arrays"] = (
        len(body),
        await measured(frontend.pid, lambda: post(http_port, "/v1/completions", "frontend", body)),
    )
    big = b"[" + b"[]," * (10 * MB) + b"[]]"
    rises["status: a 30 MB POST"] = (
        len(big),
        await measured(decode.pid, lambda: post(status_port, "/health", "status", big)),
    )

    print({what: (sent // 1024, rise // 1024) for what, (sent, rise) in rises.items()})  # KiB
    status, text = answers["frontend"]
    assert status == 400 and b"to decode" in text, answers["frontend"]
    assert 400 <= answers["status"][0] < 500, answers["status"]
    for what, (sent, rise) in rises.items():  # undecoded: 70× for msgpack maps, 21× for JSON arrays
        bound = decode_budget(sent) + ALLOCATOR_SLACK
        assert rise <= bound, f"{what}: {sent} bytes raised the peak RSS by {rise} bytes"

    # everything still serves
    good = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 3, "ignore_eos": True}
    status, answer = await fetch(
        f"http://127.0.0.1:{http_port}/v1/completions",
        method="POST",
        body=json.dumps(good).encode(),
        timeout=60,
    )
    assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 3, answer[:300]
    for process in (prefill, decode, over_nats, frontend):
        assert process.running
