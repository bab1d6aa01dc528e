"""File discovery (``file://DIR``): processes of one host find each other through a folder, no etcd.

The runtime's client modes run over it in test_runtime.py (``file-tcp``, ``file-nats``); here:
keys as files, a runtime's own keys at once, a SIGKILLed worker dropped after its lease TTL,
and two frontends serving the same workers."""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from helpers import ECHO_WORKER, FRONTEND, ROOT, collect, free_port

from dynamo_nb import DistributedRuntime, launch
from dynamo_nb.errors import ConfigError
from dynamo_nb.runtime.discovery import FileDiscovery, make_discovery

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

MOCKER = ROOT / "components" / "mocker_worker.py"


async def echo(request: object, context: object) -> AsyncIterator[object]:
    yield request


async def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    """Poll ``condition()`` until it holds; a TimeoutError after ``timeout`` seconds."""

    async def holds() -> None:
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(holds(), timeout)


async def test_instances_are_files_and_leave_with_their_runtime(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    worker = await DistributedRuntime.create(url)
    caller = await DistributedRuntime.create(url)
    try:
        server = await worker.endpoint("dyn.files.generate").serve(echo)
        assert worker.request_plane.name == "tcp"  # processes of one host: the TCP plane by default
        names = [p.name for p in (tmp_path / "keys").iterdir()]
        assert any(name.endswith(f"@{worker.connection_id:x}") for name in names), names
        client = await caller.endpoint("dyn.files.generate").client()
        assert await client.wait_for_instances(timeout=10) == [server.instance_id]
        assert await collect(client.round_robin("hello")) == ["hello"]
        await worker.shutdown(grace=0)
        await wait_for(lambda: client.instance_ids() == [], timeout=5)  # deleted, not expired
        assert not any((tmp_path / "keys").iterdir())
        assert [p.name for p in (tmp_path / "leases").iterdir()] == [f"{caller.connection_id:x}"]
    finally:
        await caller.shutdown(grace=0)
        await worker.shutdown(grace=0)


async def test_a_folder_of_dynamos_runtime_is_refused_and_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder holding NVIDIA Dynamo's own discovery keys (``v1/``: workers on ``--runtime
    dynamo``) cannot be read by the kit: the runtime says which frontend serves them and writes
    nothing there; one where Dynamo's keys appear later is said once in the log."""
    theirs = tmp_path / "theirs"
    (theirs / "v1" / "instances").mkdir(parents=True)
    with pytest.raises(
        ConfigError, match=r"NVIDIA Dynamo's discovery folder.*dynamo_nb dynamo-frontend --discovery file://"
    ):
        await DistributedRuntime.create(f"file://{theirs}")
    assert [p.name for p in theirs.iterdir()] == ["v1"]
    shared = tmp_path / "shared"
    runtime = await DistributedRuntime.create(f"file://{shared}")
    try:
        await runtime.endpoint("dyn.files.generate").client()  # a watch: the folder is polled
        (shared / "v1").mkdir()
        await wait_for(lambda: "NVIDIA Dynamo's discovery folder" in caplog.text, timeout=10)
    finally:
        await runtime.shutdown(grace=0)
    assert caplog.text.count("NVIDIA Dynamo's discovery folder") == 1


def test_bad_file_urls_and_ttls_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected 'file://DIR'"):
        make_discovery("file://")
    with pytest.raises(ConfigError, match="lease_ttl must be more than"):
        FileDiscovery(f"file://{tmp_path}", lease_ttl=0.5)


async def test_a_sigkilled_worker_leaves_after_its_lease_ttl(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'discovery'}"
    worker = await launch(
        ECHO_WORKER,
        "--discovery",
        url,
        "--lease-ttl",
        "2",
        cwd=ROOT,
        log_dir=tmp_path,
        show_logs=False,
        timeout=60,
    )
    runtime = await DistributedRuntime.create(url)
    try:
        client = await runtime.endpoint("dynamo.echo.generate").client()
        assert await client.wait_for_instances(timeout=10)
        worker.send_signal(signal.SIGKILL)
        await worker.wait(timeout=10)
        # nobody deleted its files: its lease stops being refreshed and readers drop it after 2 s
        await wait_for(lambda: client.instance_ids() == [], timeout=10)
        # after twice the TTL a reader removes the dead runtime's files
        await wait_for(lambda: not any((tmp_path / "discovery" / "keys").iterdir()), timeout=10)
    finally:
        await runtime.shutdown(grace=0)
        await worker.stop(timeout=5)


async def test_two_frontends_serve_the_same_workers_without_etcd(tmp_path: Path) -> None:
    discovery = ["--discovery", f"file://{tmp_path / 'discovery'}"]
    common = {"cwd": ROOT, "log_dir": tmp_path, "show_logs": False, "timeout": 60}
    mocker = await launch(MOCKER, *discovery, "--num-workers", "2", "--speedup-ratio", "10", **common)
    ports = [free_port(), free_port()]
    frontends = await asyncio.gather(
        *(
            launch(FRONTEND, *discovery, "--http-port", str(port), name=f"frontend-{port}", **common)
            for port in ports
        )
    )
    try:
        for port in ports:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                for _ in range(200):  # the model card arrives with the next poll of the folder
                    health = (await http.get("/health")).json()
                    if len(health["instances"]) == 2:
                        break
                    await asyncio.sleep(0.05)
                assert len(health["instances"]) == 2, health
                body = {"model": health["models"][0], "prompt": "hello", "max_tokens": 3}
                response = await http.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                assert response.json()["usage"]["completion_tokens"] == 3
    finally:
        for process in (*frontends, mocker):
            await process.stop(timeout=10)


@pytest.mark.parametrize("wipe", ["the folder", "its files"])
async def test_a_wiped_folder_loses_no_request(tmp_path: Path, wipe: str) -> None:
    """The discovery folder wiped under a serving worker and its caller: the caller keeps the
    instance it knew (calls answer throughout), both write their lease and keys again, and the
    worker's key is back without restarting anything."""
    root = tmp_path / "discovery"
    url = f"file://{root}"
    worker = await DistributedRuntime.create(url, lease_ttl=1.5)
    caller = await DistributedRuntime.create(url, lease_ttl=1.5)
    try:
        server = await worker.endpoint("dyn.wipe.generate").serve(echo)
        client = await caller.endpoint("dyn.wipe.generate").client()
        assert await client.wait_for_instances(timeout=10) == [server.instance_id]
        worker_key = f"@{worker.connection_id:x}"

        def worker_key_back() -> bool:
            return any(p.name.endswith(worker_key) for p in (root / "keys").glob("*"))

        if wipe == "the folder":
            shutil.rmtree(root)
        else:
            for file in [*root.glob("keys/*"), *root.glob("leases/*")]:
                file.unlink()
        answered = 0

        async def call_until_the_worker_is_back() -> None:
            nonlocal answered
            while not worker_key_back() or answered < 20:
                assert client.instance_ids() == [server.instance_id]
                assert await collect(client.round_robin(answered)) == [answered]
                answered += 1
                await asyncio.sleep(0.02)  # a steady trickle over the caller's polls

        await asyncio.wait_for(call_until_the_worker_is_back(), 15)
        assert (root / "leases" / f"{caller.connection_id:x}").exists()  # the caller wrote its own lease
        assert client.instance_ids() == [server.instance_id]
    finally:
        await caller.shutdown(grace=0)
        await worker.shutdown(grace=0)


async def test_a_wipe_the_keep_alive_noticed_first_still_reaches_the_watches(tmp_path: Path) -> None:
    """The lease keep-alive can notice a wipe before the poll does; it writes the lease back, so
    the folder no longer shows the wipe, yet the next scan must still report it (else the
    watches drop the keys whose owners have not written them again)."""
    discovery = FileDiscovery(f"file://{tmp_path / 'discovery'}", lease_ttl=60)
    await discovery.start()
    try:
        await discovery.put("v1/mine", b"1")
        shutil.rmtree(tmp_path / "discovery")
        await asyncio.to_thread(discovery._refresh_lease)  # the keep-alive's step, first
        snapshot, wiped = await asyncio.to_thread(discovery._scan_noting_wipes)
        assert (snapshot, wiped) == ({"v1/mine": b"1"}, True)
        assert (await asyncio.to_thread(discovery._scan_noting_wipes))[1] is False  # told once
    finally:
        await discovery.close()
