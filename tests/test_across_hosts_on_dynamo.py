"""The kit's hf workers on NVIDIA Dynamo's runtime (``--runtime dynamo``) across hosts, behind
Dynamo's own frontend on another: etcd and NATS on ``svc``, the frontend on ``fe``, workers on
``w1`` and ``w2``, requests from ``cl`` — network namespaces joined by a switch that delays
(2 ms one way) and drops (1 %) frames (`dynamo_nb.testing.hosts`).

Checked: what each worker registers is its own host's address (never loopback), the greedy text
equals the kit's own runtime's, a prefill/decode pair moves each request's KV from one host to
the other through the prefill's bootstrap server, and a worker cut off the network is routed
around by Dynamo's frontend (with its ``--migration-limit``, no request fails) and serves again
once healed. Needs root and Dynamo's packages: ``-m dynamo`` with ``DYN_NB_NETNS=1``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_on_dynamo import CHAT, MODEL, ROOT, ask_with_dynamos_client, our_text

from dynamo_nb import LocalServices, ManagedProcess
from dynamo_nb.on_dynamo import DynamoFrontend, launch_dynamo_frontend
from dynamo_nb.testing.hosts import HostNetwork

pytestmark = [pytest.mark.netns, pytest.mark.dynamo, pytest.mark.processes]

HOSTS = ["svc", "fe", "w1", "w2", "cl"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
async def network() -> AsyncIterator[tuple[HostNetwork, LocalServices]]:
    async with await HostNetwork.start(HOSTS, seed=13) as net:  # its services stop with it
        services = await net["svc"].services()
        await net.shape(delay_ms=2, loss=0.01)  # every link: 4 ms round trips, 1 % of frames lost each way
        yield net, services


class Fleet:
    """Workers and Dynamo's frontend started on the network's hosts, stopped at the end."""

    def __init__(self, net: HostNetwork, services: LocalServices, log_dir: Path) -> None:
        self.net, self.services, self.log_dir = net, services, log_dir
        self.workers: list[ManagedProcess] = []
        self.frontend: DynamoFrontend | None = None

    @property
    def planes(self) -> list[str]:
        return ["--discovery", str(self.services.etcd_url), "--nats-url", str(self.services.nats_url)]

    async def worker(self, host: str, *flags: str) -> ManagedProcess:
        """hf_worker.py on ``host`` with --runtime dynamo, listening on that host's address."""
        process = await self.net[host].launch(
            "components/hf_worker.py", "--runtime", "dynamo", *self.planes, "--tcp-host", self.net[host].address,
            "--allow-unauthenticated", *flags, env=ONE_THREAD, cwd=ROOT, log_dir=self.log_dir, show_logs=False,
            timeout=180, name=host,
        )  # fmt: skip
        self.workers.append(process)
        return process

    async def start_frontend(self, *flags: str) -> str:
        """python -m dynamo.frontend on ``fe``'s address; its URL once it lists the model."""
        fe = self.net["fe"]
        self.frontend = await launch_dynamo_frontend(
            str(self.services.etcd_url), *flags, nats_url=str(self.services.nats_url), host=fe.address,
            allow_unauthenticated=True, network_host=fe, log_dir=self.log_dir, show_logs=False, timeout=120,
        )  # fmt: skip
        for _ in range(600):
            status, models = await self.get("/v1/models")
            if status == 200 and any(entry["id"] == MODEL for entry in models["data"]):
                return self.frontend.url
            await asyncio.sleep(0.1)
        raise AssertionError(f"Dynamo's frontend did not list {MODEL}: {self.frontend.process.tail()}")

    async def get(self, path: str) -> tuple[int, Any]:
        return await self._request("GET", path, None)

    async def chat(self, body: dict[str, Any] = CHAT) -> tuple[int, Any]:
        return await self._request("POST", "/v1/chat/completions", body)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        """From the client host, within 60 s."""
        assert self.frontend is not None
        client = self.net["cl"].http_client()
        try:
            data, headers = (
                (b"", None)
                if body is None
                else (json.dumps(body).encode(), {"Content-Type": "application/json"})
            )
            answer = await asyncio.wait_for(
                client.request(method, self.frontend.url + path, data, headers), 60
            )
            text = await asyncio.wait_for(answer.read(), 60)
            return answer.status, json.loads(text) if text else None
        finally:
            await client.close()

    async def generate_instances(self) -> dict[int, str]:
        """Dynamo's frontend's view: each generate instance → the TCP address it is reached at."""
        _, health = await self.get("/health")
        return {entry["instance_id"]: entry["transport"]["tcp"] for entry in health["instances"]
                if entry["endpoint"] == "generate"}  # fmt: skip

    async def etcd_values(self) -> list[str]:
        """Every value in etcd, as text, read from the client host over etcd's JSON gateway."""
        url = str(self.services.etcd_url).replace("etcd://", "http://")
        body = {"key": base64.b64encode(b"\0").decode(), "range_end": base64.b64encode(b"\0").decode()}
        client = self.net["cl"].http_client()
        try:
            answer = await asyncio.wait_for(
                client.request("POST", f"{url}/v3/kv/range", json.dumps(body).encode()), 30
            )
            reply = json.loads(await asyncio.wait_for(answer.read(), 30))
        finally:
            await client.close()
        return [base64.b64decode(kv["value"]).decode(errors="replace") for kv in reply.get("kvs", [])]

    async def stop(self) -> None:
        if self.frontend is not None:
            assert await self.frontend.stop() == 0, self.frontend.process.tail()
        for worker in reversed(self.workers):
            assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.fixture
async def fleet(network: tuple[HostNetwork, LocalServices], tmp_path: Path) -> AsyncIterator[Fleet]:
    net, services = network
    await net.heal()
    fleet = Fleet(net, services, tmp_path)
    try:
        yield fleet
    finally:
        await net.heal()
        await fleet.stop()


async def text_of(fleet: Fleet) -> str:
    status, answer = await fleet.chat()
    assert status == 200, answer
    return str(answer["choices"][0]["message"]["content"])


async def test_two_workers_on_two_hosts_one_cut_off_is_routed_around_and_serves_again_once_healed(
    fleet: Fleet, hf_engine: Any, tiny_path: Path
) -> None:
    expected = await our_text(hf_engine, tiny_path)
    net = fleet.net
    await asyncio.gather(fleet.worker("w1"), fleet.worker("w2"))
    await fleet.start_frontend("--migration-limit", "3")
    for _ in range(300):
        instances = await fleet.generate_instances()
        if len(instances) == 2:
            break
        await asyncio.sleep(0.1)
    # each worker registered the address of its own host: reachable from the frontend's, not loopback
    assert sorted(address.rsplit(":", 1)[0] for address in instances.values()) == sorted(
        [net["w1"].address, net["w2"].address]
    ), instances
    for _ in range(4):  # round robin: both workers, the text of the kit's own runtime
        assert await text_of(fleet) == expected

    # w1 alive but unreachable: the request sent to it waits out Dynamo's request-plane deadline
    # and migrates to w2; the others go to w2. None fails, every one from w2 (w1 is cut off)
    await net.cut("w1")
    took = []
    for _ in range(8):
        started = time.monotonic()
        assert await text_of(fleet) == expected
        took.append(time.monotonic() - started)
    assert max(took) >= 4.5, took  # one waited out the deadline (5 s) on w1, then moved (docs/dynamo.md)
    # healed, it serves again without a restart: with w2 cut off now, w1 answers everything
    await net.heal("w1")
    await net.cut("w2")
    for _ in range(6):
        assert await text_of(fleet) == expected
    assert all(worker.running for worker in fleet.workers)


async def test_a_prefill_and_a_decode_on_two_hosts_move_the_kv_between_them(
    fleet: Fleet, hf_engine: Any, tiny_path: Path
) -> None:
    """Dynamo's frontend sends both legs; the decode worker on w2 fetches each request's KV from the
    bootstrap server of the prefill worker on w1, which it published with w1's address."""
    expected = await our_text(hf_engine, tiny_path)
    net = fleet.net
    await asyncio.gather(fleet.worker("w1", "--mode", "prefill"), fleet.worker("w2", "--mode", "decode"))
    await fleet.start_frontend()
    assert fleet.frontend is not None
    for _ in range(600):  # until Dynamo's frontend has taken the prefill worker into its prefill router
        if any("Prefill router target activated" in line for line in fleet.frontend.process.logs()):
            break
        await asyncio.sleep(0.05)
    for _ in range(3):
        assert await text_of(fleet) == expected
    where = str(fleet.services.etcd_url)
    [stats] = await ask_with_dynamos_client(
        where, "dynamo.prefill.stats", {}, nats_url=str(fleet.services.nats_url), host=net["cl"]
    )
    assert stats["kv_served"] == 3 and stats["bootstrap_rooms"] == 0, stats  # each fetched, none left
    published = [value for value in await fleet.etcd_values() if "bootstrap_host" in value]
    assert published and all(f'"bootstrap_host":"{net["w1"].address}"' in value for value in published), (
        published
    )
    decode = fleet.workers[1]
    assert not any("bootstrap_token" in line for line in decode.logs()), decode.tail()
