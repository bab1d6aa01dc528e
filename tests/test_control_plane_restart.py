"""The control plane restarting under running processes (private etcd and nats-server,
SIGKILLed and started again on the same port with the same data): requests keep being served
from the frontend's cached view while etcd is away; afterwards a worker that died meanwhile is
gone after its lease TTL and the others stay, without restarting any process; a worker whose
lease was lost re-registers by itself; after a NATS outage longer than the old reconnect limit
the NATS request plane serves again and a KV router re-syncs from the workers' snapshots."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aetcd
import httpx
import pytest
from helpers import FRONTEND, ROOT, free_port

from dynamo_nb import DistributedRuntime, LocalServices
from dynamo_nb.launch import launch
from dynamo_nb.router.kv.kv_events import KvIndexer

pytestmark = pytest.mark.timeout(180)

MOCKER = ROOT / "components" / "mocker_worker.py"
# long enough for full KV blocks (16 tokens each), so a worker publishes KV events
BODY = {"model": "tiny-llama", "prompt": "the control plane restarts " * 20, "max_tokens": 4}


@pytest.fixture
async def private_services() -> AsyncIterator[LocalServices]:
    """etcd and nats-server of this test only (the session's are shared: never kill those)."""
    services = await LocalServices.start()
    yield services
    await services.stop()


async def start(tmp_path: Path, *flags: Any, script: Path = MOCKER) -> Any:
    return await launch(script, *flags, cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=60)


async def instances(http: httpx.AsyncClient) -> set[int]:
    return {int(i["instance_id"], 16) for i in (await http.get("/health")).json()["instances"]}


async def until(check: Any, timeout: float = 20.0) -> bool:
    """Poll ``await check()`` until it is true (at most ``timeout`` seconds)."""
    for _ in range(int(timeout / 0.1)):
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_etcd_killed_and_restarted_under_running_workers_and_a_frontend(
    private_services: LocalServices, tmp_path: Path
) -> None:
    services = private_services
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--lease-ttl", 2]
    mocker = [*bus, "--endpoint", "cp.backend.generate", "--speedup-ratio", 100]
    survivor, doomed = [await start(tmp_path, *mocker) for _ in range(2)]
    port = free_port()
    frontend = await start(tmp_path, *bus, "--http-port", port, script=FRONTEND)
    processes = [survivor, doomed, frontend]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert await until(lambda: _has(http, {survivor.instance_id, doomed.instance_id}))

            await services.kill("etcd")
            for _ in range(4):  # served from the cached view
                assert (await http.post("/v1/completions", json=BODY)).status_code == 200
            doomed.send_signal(signal.SIGKILL)  # dies while nobody can see it go
            await doomed.wait(timeout=10)
            await asyncio.sleep(3)  # longer than the lease TTL: nothing crashes
            for _ in range(4):  # the dead worker is skipped (its connection is gone)
                assert (await http.post("/v1/completions", json=BODY)).status_code == 200

            await services.restart("etcd")
            # the dead worker's lease expires; the survivor keeps (or re-creates) its own
            assert await until(lambda: _has(http, {survivor.instance_id}))
            assert (await http.post("/v1/completions", json=BODY)).status_code == 200
            assert survivor.returncode is None and frontend.returncode is None  # no process restarted

            # the survivor's lease is lost outright (revoked): it re-grants it and re-publishes
            host, etcd_port = services.etcd_url.removeprefix("etcd://").split(":")
            async with aetcd.Client(host=host, port=int(etcd_port)) as etcd:
                leases = {kv.lease for kv in await etcd.get_all() if kv.lease}
                for lease in leases:
                    await etcd.revoke_lease(lease)
            assert leases
            assert await until(lambda: _has(http, {survivor.instance_id}), timeout=30)
            assert (await http.post("/v1/completions", json=BODY)).status_code == 200
    finally:
        for process in processes:
            await process.stop(timeout=5)


async def test_etcd_back_without_its_data_under_load_loses_nothing(
    private_services: LocalServices, tmp_path: Path
) -> None:
    """etcd SIGKILLed under steady load and started again from an empty data directory (every
    key lost): the frontend keeps routing to the instances it knew while the workers register
    again, so no request fails and /health never says there is no instance."""
    services = private_services
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--lease-ttl", 2]
    mocker = [*bus, "--endpoint", "wipe.backend.generate", "--speedup-ratio", 100]
    workers = [await start(tmp_path, *mocker) for _ in range(2)]
    port = free_port()
    frontend = await start(tmp_path, *bus, "--http-port", port, script=FRONTEND)
    wanted = {worker.instance_id for worker in workers}
    failures: list[str] = []
    served = [0]
    progress = asyncio.Event()  # set at each answer: the test waits for answers, not for seconds
    stop = asyncio.Event()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert await until(lambda: _has(http, wanted))

            async def load() -> None:
                while not stop.is_set():
                    answer = await http.post("/v1/completions", json=BODY)
                    if answer.status_code != 200:
                        failures.append(f"{answer.status_code} {answer.text[:200]}")
                    served[0] += 1
                    progress.set()

            async def health() -> None:
                while not stop.is_set():
                    answer = await http.get("/health")
                    if answer.status_code != 200 or not answer.json().get("instances"):
                        failures.append(f"/health {answer.status_code} {answer.text[:200]}")
                    await asyncio.sleep(0.02)

            async def served_more(count: int) -> None:
                target = served[0] + count
                while served[0] < target:
                    progress.clear()
                    await asyncio.wait_for(progress.wait(), 30)

            tasks = [asyncio.create_task(load()) for _ in range(3)] + [asyncio.create_task(health())]
            await served_more(20)
            await services.kill("etcd")
            await served_more(20)  # served from the cached view
            await services.restart("etcd", lose_data=True)
            host, etcd_port = services.etcd_url.removeprefix("etcd://").split(":")
            async with aetcd.Client(host=host, port=int(etcd_port)) as etcd:

                async def registered_again() -> bool:
                    return len(list(await etcd.get_prefix(b"v1/instances/wipe/backend/generate/"))) == len(
                        wanted
                    )

                assert await until(registered_again, timeout=30)
            await served_more(40)  # on the fresh etcd, each worker's records written again
            stop.set()
            await asyncio.gather(*tasks)
            assert failures == []
            assert await instances(http) == wanted
            assert all(process.returncode is None for process in [*workers, frontend])
    finally:
        stop.set()
        for process in [*workers, frontend]:
            await process.stop(timeout=5)


async def _has(http: httpx.AsyncClient, wanted: set[int]) -> bool:
    try:
        return await instances(http) == wanted and bool((await http.get("/v1/models")).json()["data"])
    except httpx.HTTPError:
        return False


@pytest.mark.long  # ~18 s: kept out of the default run's budget; .ci/run's second step runs it
async def test_nats_killed_and_restarted_under_its_request_plane_and_kv_events(
    private_services: LocalServices, tmp_path: Path
) -> None:
    services = private_services
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--request-plane", "nats"]
    worker = await start(tmp_path, *bus, "--endpoint", "cpn.backend.generate", "--speedup-ratio", 100)
    port = free_port()
    frontend = await start(tmp_path, *bus, "--http-port", port, "--router-mode", "kv", script=FRONTEND)
    runtime = await DistributedRuntime.create(services.etcd_url, "nats", services.nats_url)
    indexer = await KvIndexer.start(runtime.endpoint("cpn.backend.generate").component())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert await until(lambda: _has(http, {worker.instance_id}))
            assert (await http.post("/v1/completions", json=BODY)).status_code == 200
            assert await until(_async(lambda: indexer.tree.block_count() > 0))  # the indexer follows events

            await services.kill("nats")
            await asyncio.sleep(7)  # longer than nats-py's 10 reconnect attempts at 0.5 s
            await services.restart("nats")

            async def served() -> bool:
                return (await http.post("/v1/completions", json=BODY)).status_code == 200

            assert await until(served, timeout=30)  # the request plane reconnected on both ends
            assert await until(_async(lambda: indexer.gaps_repaired >= 1), timeout=30)  # re-synced
            assert worker.returncode is None and frontend.returncode is None
    finally:
        await indexer.stop()
        await runtime.shutdown()
        for process in (frontend, worker):
            await process.stop(timeout=5)


def _async(check: Any) -> Any:
    async def wrapped() -> bool:
        return bool(check())

    return wrapped


async def test_a_component_started_before_etcd_and_nats_waits_for_them(
    private_services: LocalServices, tmp_path: Path
) -> None:
    """Start in any order: a worker whose etcd and NATS are not up yet waits for them (one line
    while waiting, one when connected) instead of failing at once."""
    etcd_url, nats_url = str(private_services.etcd_url), str(private_services.nats_url)
    await private_services.kill("etcd")
    await private_services.kill("nats")
    flags = [
        "--discovery",
        etcd_url,
        "--request-plane",
        "nats",
        "--nats-url",
        nats_url,
        "--connect-timeout",
        60,
    ]
    starting = asyncio.create_task(start(tmp_path, *flags))
    await asyncio.sleep(3)
    assert not starting.done(), "the worker gave up instead of waiting for etcd"
    await private_services.restart("etcd")
    await asyncio.sleep(1.5)
    assert not starting.done(), "the worker did not wait for NATS"
    await private_services.restart("nats")
    worker = await asyncio.wait_for(starting, 60)  # READY: both answered
    lines = worker.logs()
    assert sum("waiting for etcd" in line for line in lines) == 1
    assert sum("connected to etcd" in line for line in lines) == 1
    assert sum("waiting for NATS" in line for line in lines) == 1
    assert sum("connected to NATS" in line for line in lines) == 1
    await worker.stop()


@pytest.mark.processes
def test_a_component_gives_up_on_etcd_after_its_connect_timeout(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(MOCKER), "--discovery", "etcd://127.0.0.1:1", "--connect-timeout", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "waiting for etcd at etcd://127.0.0.1:1" in result.stderr
    assert "could not reach etcd" in result.stderr and "LocalServices" in result.stderr


async def test_a_restart_after_a_reset_is_not_taken_for_another_reset(
    private_services: LocalServices, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd back empty is a reset (its revision fell); etcd restarted again with its data is
    not, though its revision is still below the one seen before the reset."""
    services = private_services
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp")
    try:
        host, etcd_port = services.etcd_url.removeprefix("etcd://").split(":")
        async with aetcd.Client(host=host, port=int(etcd_port)) as etcd:
            for n in range(30):  # a revision well above what the empty store reaches (no owner
                await etcd.put(f"v1/reset/{n}".encode(), b"x")  # writes these again)
        watch = await runtime.discovery.watch_prefix("v1/reset/")
        resets = "came back at revision"
        for lose_data in (True, False):
            await services.kill("etcd")
            await services.restart("etcd", lose_data=lose_data)
            value = str(lose_data).encode()

            async def resynced(value: bytes = value) -> bool:
                # written by another client: this watch sees it once it follows etcd again
                async with aetcd.Client(host=host, port=int(etcd_port)) as etcd:
                    await etcd.put(b"v1/reset/again", value)
                return watch.items.get("v1/reset/again") == value

            assert await until(resynced, timeout=30)
        assert sum(resets in record.getMessage() for record in caplog.records) == 1, caplog.text
    finally:
        await runtime.shutdown(grace=0)
