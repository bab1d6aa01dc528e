"""Every plane across hosts: etcd and NATS on one host, the frontend on another, workers on
others, the client on its own — network namespaces joined by a switch that delays (2 ms one
way) and drops (1 %) frames, and cuts hosts off (`dynamo_nb.testing.hosts`).

What loopback hides is checked here: the address each component advertises (read back from
etcd: never a loopback or wildcard address), the KV bytes of a disaggregated request crossing
hosts on both paths, KV events from another host, cancellation over the wire, and partitions —
a worker cut mid-stream (the stream migrates; its lease expires; healed, it rejoins with its
own id and no restart) and the etcd host cut for longer than a lease (serving goes on from the
cached view; discovery converges after healing). Opt-in and root-only: ``-m netns``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import FRONTEND, HF_WORKER, MOCKER_WORKER, ROOT, collect, req

from dynamo_nb import LocalServices, ManagedProcess
from dynamo_nb.http import HttpAnswer, LeanHttpClient
from dynamo_nb.llm import ModelTokenizer
from dynamo_nb.runtime.addresses import is_loopback, is_wildcard
from dynamo_nb.testing.hosts import HostNetwork

pytestmark = [pytest.mark.netns, pytest.mark.processes]

HOSTS = ["svc", "fe", "w1", "w2", "w3", "cl"]
MODEL = "tiny-llama"
LEASE = ["--lease-ttl", "3"]
GENERATE_KEYS = "v1/instances/dynamo/backend/generate/"


@dataclass
class Cluster:
    """etcd + NATS on ``svc``; components started on the others; requests from ``cl``."""

    net: HostNetwork
    services: LocalServices
    log_dir: Path
    started: list[ManagedProcess] = field(default_factory=list)

    @property
    def etcd(self) -> list[str]:
        return ["--discovery", str(self.services.etcd_url), "--nats-url", str(self.services.nats_url)]

    async def start(
        self, host: str, script: Path, *flags: Any, timeout: float = 120.0, env: dict[str, str] | None = None
    ) -> ManagedProcess:
        process = await self.net[host].launch(
            script, *flags, cwd=ROOT, env=env, log_dir=self.log_dir, show_logs=False, timeout=timeout
        )
        self.started.append(process)
        return process

    async def frontend(self, *flags: Any) -> str:
        fe = self.net["fe"]
        process = await self.start("fe", FRONTEND, "--http-host", fe.address, "--http-port", 0, *flags)
        assert process.url is not None and process.url.startswith(f"http://{fe.address}:")
        return process.url

    def http(self) -> Http:
        return Http(self.net["cl"].http_client())

    async def etcd_values(self, prefix: str = "v1/") -> dict[str, Any]:
        """Every key under ``prefix`` with its JSON value, read from ``cl`` over etcd's JSON gateway."""
        url = str(self.services.etcd_url).replace("etcd://", "http://")
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {
            "key": base64.b64encode(prefix.encode()).decode(),
            "range_end": base64.b64encode(end.encode()).decode(),
        }
        async with self.http() as http:
            _, _, reply = await http.post(f"{url}/v3/kv/range", body)
        return {
            base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"]))
            for kv in reply.get("kvs", [])
        }

    async def stop_all(self) -> None:
        for process in reversed(self.started):
            await process.stop(timeout=5)
        self.started.clear()


class Http:
    """JSON requests from the client host, each answered within 60 s."""

    TIMEOUT = 60.0

    def __init__(self, client: LeanHttpClient) -> None:
        self.client = client

    async def __aenter__(self) -> Http:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def get(self, url: str) -> tuple[int, dict[str, str], Any]:
        return await self._whole("GET", url, b"")

    async def post(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        return await self._whole("POST", url, json.dumps(body).encode())

    @asynccontextmanager
    async def stream(self, url: str, body: dict[str, Any]) -> AsyncIterator[HttpAnswer]:
        """A POST's answer, its head in; leaving the block mid-body closes its connection."""
        answer = await asyncio.wait_for(self._send("POST", url, json.dumps(body).encode()), self.TIMEOUT)
        try:
            yield answer
        finally:
            answer.close()

    async def _whole(self, method: str, url: str, body: bytes) -> tuple[int, dict[str, str], Any]:
        async def whole() -> tuple[int, dict[str, str], Any]:
            answer = await self._send(method, url, body)
            text = await answer.read()
            return answer.status, answer.headers, json.loads(text) if text else None

        return await asyncio.wait_for(whole(), self.TIMEOUT)

    def _send(self, method: str, url: str, body: bytes) -> Any:
        headers = {"Content-Type": "application/json"} if body else None
        return self.client.request(method, url, body, headers)


@pytest.fixture(scope="module")
async def network() -> AsyncIterator[tuple[HostNetwork, LocalServices]]:
    async with await HostNetwork.start(HOSTS, seed=7) as net:  # its services stop with it
        yield net, await net["svc"].services()


@pytest.fixture
async def cluster(network: tuple[HostNetwork, LocalServices], tmp_path: Path) -> AsyncIterator[Cluster]:
    net, services = network
    await net.heal()
    await net.shape(delay_ms=2, loss=0.01)  # every link: 4 ms round trips, 1 % of frames lost each way
    cluster = Cluster(net, services, tmp_path)
    yield cluster
    await cluster.stop_all()
    await net.heal()


async def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {value!r})")
        await asyncio.sleep(0.2)


async def instances(cluster: Cluster, url: str) -> list[str]:
    """The instance ids the frontend routes to now (its /health)."""
    async with cluster.http() as http:
        _, _, body = await http.get(f"{url}/health")
    return sorted(entry["instance_id"] for entry in body["instances"])


def addresses_in(value: Any) -> Iterator[tuple[str, str]]:
    """(field, host) for every address a discovery value carries."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "address" and isinstance(item, str) and ":" in item and not item.startswith("nats"):
                yield key, item.rsplit(":", 1)[0]
            elif key == "bootstrap_host" and isinstance(item, str):
                yield key, item
            else:
                yield from addresses_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from addresses_in(item)


async def check_advertised(cluster: Cluster, expected_hosts: set[str]) -> int:
    """Every address in etcd is one of ``expected_hosts``' own: never loopback or a wildcard."""
    allowed = {cluster.net[name].address for name in expected_hosts}
    found = 0
    for key, value in (await cluster.etcd_values()).items():
        for what, host in addresses_in(value):
            assert not is_loopback(host) and not is_wildcard(host), f"{key} advertises {what}={host}"
            assert host in allowed, (
                f"{key} advertises {what}={host}, not an address of {sorted(expected_hosts)}"
            )
            found += 1
    return found


async def complete(http: Http, url: str, prompt: str, **extra: Any) -> tuple[dict[str, Any], dict[str, str]]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, **extra}
    status, headers, reply = await http.post(f"{url}/v1/completions", body)
    assert status == 200, reply
    return reply, headers


@pytest.mark.parametrize("plane", ["tcp", "nats"])
async def test_serving_kv_routing_and_cancellation_across_hosts(cluster: Cluster, plane: str) -> None:
    net = cluster.net
    plane_flags = ["--request-plane", plane]
    workers = [
        await cluster.start(
            host,
            MOCKER_WORKER,
            *cluster.etcd,
            *plane_flags,
            "--speedup-ratio",
            5,
            "--system-host",
            net[host].address,
            "--system-port",
            9090,
        )
        for host in ("w1", "w2")
    ]
    url = await cluster.frontend(*cluster.etcd, *plane_flags, "--router-mode", "kv")
    ids = sorted(f"{w.instance_id:x}" for w in workers)
    await wait_for(lambda: _equal(instances(cluster, url), ids), 20, "both workers routed to")
    found = await check_advertised(cluster, {"w1", "w2"})
    async with cluster.http() as http:
        _, _, health = await http.get(f"{url}/health")
    transports = [entry["transport"] for entry in health["instances"]]
    assert {t["kind"] for t in transports} == {plane}
    # over TCP every endpoint of each worker has an address; over NATS a subject, no address
    assert found >= 2 if plane == "tcp" else found == 0

    async with cluster.http() as http:
        # KV events cross hosts: a repeated prompt goes back to the worker that cached it
        for i in range(4):
            prompt = f"request {i} " + "a long shared prefix of words " * 12
            first, first_headers = await complete(http, url, prompt)
            again, again_headers = await complete(http, url, prompt)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert again_headers["x-dynamo-decode-worker"] == first_headers["x-dynamo-decode-worker"]
            assert first["choices"][0]["text"]

        # a stream read across hosts, then cancelled by the client: the worker stops it
        body = {"model": MODEL, "prompt": "stream me", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        async with http.stream(f"{url}/v1/completions", body) as response:
            assert response.status == 200, await response.read()
            worker = next(
                w for w in workers if f"{w.instance_id:x}" == response.headers["x-dynamo-decode-worker"]
            )
            status = f"http://{worker.host.address}:9090/health"  # type: ignore[union-attr]
            chunks = 0
            async for line in response.lines():
                chunks += line.startswith(b"data: {")
                if chunks == 5:
                    break
            _, _, worker_health = await http.get(status)
            assert sum(worker_health["inflight"].values()) == 1
        await wait_for(lambda: _inflight_is(http, status, 0), 10, "the worker stopped the cancelled stream")


async def _equal(got: Any, expected: Any) -> bool:
    return (await got) == expected


async def generate_ids(cluster: Cluster) -> list[str]:
    """The instance ids etcd holds for the generate endpoint (each once per instance)."""
    return sorted(key.rsplit("/", 1)[-1] for key in await cluster.etcd_values(GENERATE_KEYS))


async def _inflight_is(http: Http, status: str, count: int) -> bool:
    _, _, health = await http.get(status)
    return sum(health["inflight"].values()) == count


@pytest.mark.parametrize("plane", ["nats", "tcp"])
async def test_static_mode_across_hosts(cluster: Cluster, tiny_path: Path, plane: str) -> None:
    """No discovery: over NATS two workers share the endpoint's subject; over TCP the worker
    listens on the address it is given and the frontend is told it (``--static-address``)."""
    nats = ["--nats-url", str(cluster.services.nats_url)]
    w1 = cluster.net["w1"].address
    if plane == "nats":
        for host in ("w1", "w2"):
            worker = await cluster.start(
                host, MOCKER_WORKER, "--static", *nats, "--endpoint", "st.backend.generate"
            )
            assert worker.ready_line.startswith("READY st.backend.generate")
        reach = nats
    else:
        worker = await cluster.start(
            "w1", MOCKER_WORKER, "--static", "--tcp-host", w1, "--tcp-port", 7000, "--endpoint", "st.backend.generate"
        )  # fmt: skip
        reach = ["--request-plane", "tcp", "--static-address", f"tcp://{w1}:7000"]
    url = await cluster.frontend(
        "--static-endpoint", "st.backend.generate", "--model-name", MODEL, "--model-path", tiny_path, *reach
    )  # fmt: skip
    async with cluster.http() as http:
        await wait_for(lambda: _has_model(http, url), 20, "the static model")
        for i in range(4):
            reply, _ = await complete(http, url, f"hello {i}")
            assert reply["usage"]["completion_tokens"] == 8


async def _has_model(http: Http, url: str) -> bool:
    status, _, models = await http.get(f"{url}/v1/models")
    return bool(models["data"]) if status == 200 else False


async def test_disaggregated_fast_and_fallback_move_the_kv_across_hosts(
    cluster: Cluster, hf_engine: Any, tiny_path: Path
) -> None:
    one_thread = {"OMP_NUM_THREADS": "1"}
    await asyncio.gather(
        cluster.start("w1", HF_WORKER, *cluster.etcd, "--mode", "prefill", env=one_thread),
        cluster.start(
            "w2", HF_WORKER, *cluster.etcd, "--mode", "prefill", "--no-bootstrap-endpoint", env=one_thread
        ),
        cluster.start("w3", HF_WORKER, *cluster.etcd, "--mode", "decode", env=one_thread),
    )
    url = await cluster.frontend(*cluster.etcd)
    cards = await cluster.etcd_values("v1/mdc/")
    endpoints = [
        c["runtime_config"].get("disaggregated_endpoint") for c in cards.values() if c["kinds"] == ["prefill"]
    ]
    published = [e for e in endpoints if e]
    assert len(endpoints) == 2 and len(published) == 1
    assert published[0]["bootstrap_host"] == cluster.net["w1"].address  # reachable from w3, not loopback
    assert await check_advertised(cluster, {"w1", "w2", "w3"}) >= 4

    tokenizer = ModelTokenizer.load(tiny_path)
    prompt = "Once upon a time, across three hosts,"
    request = {"token_ids": tokenizer.encode(prompt, add_special_tokens=True),
               "stop_conditions": {"max_tokens": 12}, "sampling_options": {"temperature": 0}}  # fmt: skip
    expected = tokenizer.decode(
        [t for item in await collect(hf_engine.generate(req(request))) for t in item["token_ids"]]
    )
    async with cluster.http() as http:
        await wait_for(lambda: _has_model(http, url), 30, "the disaggregated model")
        paths = {}
        for _ in range(4):  # round robin over the two prefill workers: both paths, twice
            reply, headers = await complete(http, url, prompt, max_tokens=12)
            assert reply["choices"][0]["text"] == expected  # the KV that crossed hosts is the right one
            paths[headers["x-dynamo-path"]] = headers["x-dynamo-prefill-worker"]
    assert set(paths) == {"fast", "fallback"}


async def test_a_worker_cut_mid_stream_migrates_expires_and_rejoins(cluster: Cluster) -> None:
    net = cluster.net
    workers = [
        await cluster.start(host, MOCKER_WORKER, *cluster.etcd, *LEASE, "--speedup-ratio", 1)
        for host in ("w1", "w2")
    ]
    url = await cluster.frontend(*cluster.etcd, "--migration-limit", 3)
    ids = sorted(f"{w.instance_id:x}" for w in workers)
    await wait_for(lambda: _equal(instances(cluster, url), ids), 20, "both workers")
    tokens = 400
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    async with cluster.http() as http, http.stream(f"{url}/v1/completions", body) as response:
        serving = response.headers["x-dynamo-decode-worker"]
        victim = next(w for w in workers if f"{w.instance_id:x}" == serving)
        assert victim.host is not None
        usage, last, longest_gap, chunks = None, time.monotonic(), 0.0, 0
        async for line in response.lines():
            if not line.startswith(b"data: {"):
                continue
            now = time.monotonic()
            longest_gap, last = max(longest_gap, now - last), now
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            chunks += bool(event["choices"])
            if chunks == 20:
                await net.cut(victim.host.name)  # alive, unreachable: no reset reaches the frontend
                cut_at = time.monotonic()
    print(f"longest gap in the stream: {longest_gap:.2f} s")
    assert usage is not None and usage["completion_tokens"] == tokens  # one continuous stream
    # the frontend's hang watchdog notices the silent worker (at least --hang-after, 1 s) and re-sends the
    # stream to the other worker before the request plane's heartbeat timeout (5 s) would
    assert 1.0 <= longest_gap < 4.0, longest_gap
    assert time.monotonic() - cut_at < 30

    # its lease (3 s) expires in etcd: the frontend drops it
    survivor = [i for i in ids if i != serving]
    await wait_for(lambda: _equal(instances(cluster, url), survivor), 15, "the cut worker dropped")
    # healed: it grants its lease again (same id) and re-publishes, with no restart
    await net.heal()
    await wait_for(lambda: _equal(instances(cluster, url), ids), 20, "the healed worker back")
    assert victim.running and all(w.running for w in workers)
    await wait_for(lambda: _equal(generate_ids(cluster), ids), 10, "its own id again in etcd, no duplicate")
    async with cluster.http() as http:
        replies = [await complete(http, url, f"after healing {i}") for i in range(4)]
    assert {headers["x-dynamo-decode-worker"] for _, headers in replies} == set(ids)


async def test_the_etcd_host_cut_longer_than_a_lease_serving_goes_on_and_discovery_converges(
    cluster: Cluster,
) -> None:
    net = cluster.net
    workers = [
        await cluster.start(host, MOCKER_WORKER, *cluster.etcd, *LEASE, "--speedup-ratio", 10)
        for host in ("w1", "w2")
    ]
    url = await cluster.frontend(*cluster.etcd)
    ids = sorted(f"{w.instance_id:x}" for w in workers)
    await wait_for(lambda: _equal(instances(cluster, url), ids), 20, "both workers")

    await net.cut("svc")
    cut_at = time.monotonic()
    async with cluster.http() as http:
        served = set()
        while time.monotonic() - cut_at < 8:  # well past the 3 s leases
            _, headers = await complete(http, url, "while etcd is away")
            served.add(headers["x-dynamo-decode-worker"])
            await asyncio.sleep(0.5)
    assert served == set(ids)  # from the cached view, on both workers
    await net.heal("svc")

    # every lease expired in etcd meanwhile; the workers grant theirs again and the watch resyncs
    await wait_for(lambda: _equal(instances(cluster, url), ids), 30, "discovery after healing")
    late = await cluster.start("w3", MOCKER_WORKER, *cluster.etcd, *LEASE, "--speedup-ratio", 10)
    everyone = sorted([*ids, f"{late.instance_id:x}"])
    await wait_for(lambda: _equal(instances(cluster, url), everyone), 20, "a worker started after healing")
    await wait_for(lambda: _equal(generate_ids(cluster), everyone), 10, "each worker once in etcd")
