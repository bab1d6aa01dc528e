"""Workers in other processes: components/echo_worker.py over real etcd, TCP and NATS."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from typing import Any

import pytest
from helpers import RuntimeFactory, collect

from dynamo_nb import InstanceDownError, RemoteHandlerError
from dynamo_nb.errors import NoInstancesError

pytestmark = pytest.mark.timeout(90)


async def stats_of(client: Any, instance_id: int) -> dict[str, Any]:
    return (await collect(client.direct({}, instance_id)))[0]


async def wait_until(predicate: Any, timeout: float, step: float = 0.05) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(step)
    return await predicate()


@pytest.mark.parametrize("plane", ["tcp", "nats"])
async def test_workers_in_other_processes(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any, plane: str
) -> None:
    ns = f"xproc-{plane}"
    flags = [
        "--discovery",
        services.etcd_url,
        "--request-plane",
        plane,
        "--nats-url",
        services.nats_url,
        "--endpoint",
        f"{ns}.echo.generate",
    ]
    workers = [await start_worker(*flags), await start_worker(*flags)]
    rt = await make_runtime(f"etcd-{plane}")
    client = await rt.endpoint(f"{ns}.echo.generate").client()
    stats = await rt.endpoint(f"{ns}.echo.stats").client()
    await client.wait_for_instances(timeout=10)

    async def both() -> bool:
        return len(client.instance_ids()) == 2

    assert await wait_until(both, 10)
    ids = client.instance_ids()
    assert len(ids) == 2 and all(f"instance={i:x}" in " ".join(w.ready_line for w in workers) for i in ids)
    expected = [{"word": "a", "index": 0}, {"word": "b", "index": 1}]

    # each client mode
    assert {client.round_robin({"text": "x"}).instance_id for _ in range(2)} == set(ids)
    assert await collect(client.round_robin({"text": "a b"})) == expected
    assert await collect(client.random({"text": "a b"})) == expected
    for iid in ids:
        assert await collect(client.direct({"text": "a b"}, iid)) == expected

    # the handler's error crosses the wire with its type and message
    with pytest.raises(RemoteHandlerError) as info:
        await collect(client.direct({"text": "a b c", "fail_at": 1}, ids[0]))
    assert info.value.error_type == "ValueError" and "fail at item 1" in info.value.remote_message

    # cancellation crosses the wire: leaving the loop stops the remote handler
    before = await stats_of(stats, ids[0])
    async for item in client.direct({"text": "w " * 1000, "delay_ms": 5}, ids[0]):
        if item["index"] == 2:
            break

    async def cancelled() -> bool:
        now = await stats_of(stats, ids[0])
        return now["cancelled"] == before["cancelled"] + 1 and now["inflight"] == 0

    assert await wait_until(cancelled, 5)


@pytest.mark.parametrize("plane", ["tcp", "nats"])
async def test_a_sigkilled_worker_fails_its_stream_and_leaves_discovery(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any, plane: str
) -> None:
    ns = f"kill-{plane}"
    worker = await start_worker(
        "--discovery", services.etcd_url, "--request-plane", plane, "--nats-url", services.nats_url,
        "--endpoint", f"{ns}.echo.generate", "--lease-ttl", "2",
    )  # fmt: skip
    rt = await make_runtime(f"etcd-{plane}")
    client = await rt.endpoint(f"{ns}.echo.generate").client()
    [instance_id] = await client.wait_for_instances(timeout=10)
    stream = await client.round_robin({"text": "w " * 10000, "delay_ms": 10})
    assert (await stream.__anext__())["index"] == 0
    worker.send_signal(signal.SIGKILL)  # no goodbye
    with pytest.raises(InstanceDownError) as info:
        await asyncio.wait_for(
            collect(stream), 15
        )  # never hangs: socket EOF (tcp) or heartbeat timeout (nats)
    assert info.value.instance_id == instance_id
    # marked down at once, so requests stop going there ...
    assert instance_id not in client.instance_ids()
    # ... and gone from discovery once the lease (2 s) expires
    watch = await rt.discovery.instance_set(client.endpoint.path)

    async def gone() -> bool:
        return instance_id not in watch.ids()

    assert await wait_until(gone, 10)
    with pytest.raises(NoInstancesError):
        client.round_robin({"text": "x"})


async def test_static_mode_over_nats_needs_no_etcd(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any
) -> None:
    await start_worker("--static", "--nats-url", services.nats_url, "--endpoint", "static-x.echo.generate")
    rt = await make_runtime("static-nats")
    client = await rt.endpoint("static-x.echo.generate").client()
    assert len(await client.wait_for_instances(timeout=10)) == 1
    assert await collect(client.round_robin({"text": "a b"})) == [
        {"word": "a", "index": 0},
        {"word": "b", "index": 1},
    ]


async def test_static_mode_over_tcp_at_an_explicit_address(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = await start_worker("--static", "--request-plane", "tcp", "--tcp-port", str(port))
    assert f"address=tcp://127.0.0.1:{port}" in worker.ready_line
    rt = await make_runtime("static-tcp")
    client = await rt.endpoint("dynamo.echo.generate").client(address=f"tcp://127.0.0.1:{port}")
    await client.wait_for_instances(timeout=10)
    assert await collect(client.random({"text": "hi"})) == [{"word": "hi", "index": 0}]
    wrong = await rt.endpoint("dynamo.echo.other").client(address=f"tcp://127.0.0.1:{port}")
    with pytest.raises(NoInstancesError):
        await wrong.wait_for_instances(timeout=0.5)


async def test_a_refused_connection_marks_the_instance_down(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any
) -> None:
    worker = await start_worker(
        "--discovery", services.etcd_url, "--request-plane", "tcp", "--endpoint", "refused.echo.generate",
        "--lease-ttl", "30",
    )  # fmt: skip
    rt = await make_runtime("etcd-tcp")
    client = await rt.endpoint("refused.echo.generate").client()
    [instance_id] = await client.wait_for_instances(timeout=10)
    worker.send_signal(signal.SIGKILL)
    await worker.wait()
    with pytest.raises(InstanceDownError, match="cannot connect"):
        await collect(client.direct({"text": "x"}, instance_id))
    assert instance_id not in client.instance_ids()  # its lease still lives for 30 s; the client knows better


@pytest.mark.parametrize("plane", ["tcp", "nats"])
async def test_a_caller_whose_loop_blocked_does_not_cut_a_live_stream(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any, plane: str
) -> None:
    """A notebook cell that blocks the loop longer than the heartbeat timeout (or a process
    starved of CPU): the worker's frames are waiting unread, so the stream goes on."""
    ns = f"stall-{plane}"
    await start_worker(
        "--discovery", services.etcd_url, "--request-plane", plane, "--nats-url", services.nats_url,
        "--endpoint", f"{ns}.echo.generate",
    )  # fmt: skip
    rt = await make_runtime(f"etcd-{plane}", heartbeat_timeout=2.5)
    client = await rt.endpoint(f"{ns}.echo.generate").client()
    await client.wait_for_instances(timeout=10)
    stream = await client.round_robin({"text": "w " * 40, "delay_ms": 100})
    assert (await stream.__anext__())["index"] == 0
    time.sleep(4.0)  # noqa: ASYNC251 - blocks this loop past the 2.5 s heartbeat timeout, on purpose
    rest = await asyncio.wait_for(collect(stream), 30)
    assert [item["index"] for item in rest] == list(range(1, 40))


async def test_a_stalled_nats_worker_given_up_on_is_told_to_stop(
    make_runtime: RuntimeFactory, start_worker: Any, services: Any
) -> None:
    """A worker frozen past the heartbeat timeout (SIGSTOP): the caller gives up on its stream
    (and may send the request elsewhere), and sends a STOP, so once the worker runs again it
    does not generate the whole request for nobody."""
    worker = await start_worker(
        "--discovery", services.etcd_url, "--request-plane", "nats", "--nats-url", services.nats_url,
        "--endpoint", "frozen.echo.generate",
    )  # fmt: skip
    rt = await make_runtime("etcd-nats", heartbeat_timeout=2.5)
    client = await rt.endpoint("frozen.echo.generate").client()
    await client.wait_for_instances(timeout=10)
    stream = await client.round_robin({"text": "w " * 600, "delay_ms": 50})  # 30 s of items
    assert (await stream.__anext__())["index"] == 0
    worker.send_signal(signal.SIGSTOP)
    with pytest.raises(InstanceDownError, match="no frames or heartbeats"):
        await asyncio.wait_for(collect(stream), 20)
    worker.send_signal(signal.SIGCONT)
    report = await rt.endpoint("frozen.echo.stats").client()
    await report.wait_for_instances(timeout=10)
    for _ in range(100):
        [counts] = await collect(report.round_robin({}))
        if counts["inflight"] == 0:
            break
        await asyncio.sleep(0.1)
    assert counts["inflight"] == 0 and counts["cancelled"] == 1, counts
