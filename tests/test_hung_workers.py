"""Workers that hang instead of dying (SIGSTOP: a stuck kernel, a deadlocked engine, a frozen host)
behind a real frontend process: the frontend's watchdog finds the silent worker, moves its streams
(nothing lost), routes new requests around it and names it in `/health`, `/metrics` and the routing
decisions; a canary brings it back once it thaws; past ``--migration-limit`` its streams end with
an error naming the hang. A worker slowed down by design, and a frontend whose own loop stalls,
are not taken for hung."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port, metric_value, until

from dynamo_nb import bench

pytestmark = pytest.mark.timeout(240)

TOKENS = 64
MOCKER = [
    "--model-name",
    "m",
    "--lease-ttl",
    "30",
]  # a lease that outlives the freeze: only the watchdog sees it


async def mockers_and_a_frontend(
    start_worker: Any, bus: list[str], endpoint: str, speedups: tuple[str, ...], *frontend_flags: str
) -> tuple[dict[str, Any], Any]:
    """A mocker worker per speedup (by instance id in hex) and a frontend (with ``frontend_flags``)
    once it sees them all."""
    workers = {}
    for speedup in speedups:
        worker = await start_worker(
            *bus, *MOCKER, "--endpoint", endpoint, "--speedup-ratio", speedup, script=MOCKER_WORKER
        )
        workers[f"{worker.instance_id:x}"] = worker
    port = free_port()
    frontend = await start_worker(*bus, "--http-port", str(port), *frontend_flags, script=FRONTEND)
    await bench.wait_for_model(f"http://127.0.0.1:{port}", "m", instances=len(speedups))
    return workers, frontend


async def suspects(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    return (await http.get("/health")).json()["suspect_instances"]


@pytest.mark.parametrize("plane", ["tcp", pytest.param("nats", marks=pytest.mark.long)])
async def test_a_frozen_workers_streams_move_and_it_rejoins_once_a_canary_answers(
    plane: str, services: Any, start_worker: Any
) -> None:
    bus = ["--discovery", services.etcd_url, "--request-plane", plane]
    if plane == "nats":
        bus += ["--nats-url", services.nats_url]
    workers, frontend = await mockers_and_a_frontend(
        start_worker, bus, f"hang{plane}.backend.generate", ("1", "1")
    )
    victim_hex, victim = next(iter(workers.items()))
    (other_hex,) = [w for w in workers if w != victim_hex]
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        run = bench.run(
            frontend.url,
            "m",
            concurrency=10,
            requests=160,
            max_tokens=TOKENS,
            ignore_eos=True,
            progress=False,
            timeout=60,
        )
        load = asyncio.create_task(run)

        async def done() -> float:
            return metric_value((await http.get("/metrics")).text, "dynamo_frontend_requests_total",
                                model="m", status="success") or 0.0  # fmt: skip

        await until(lambda: done(), timeout=60, step=0.05, what="requests finishing before the freeze")
        victim.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: suspects(http), timeout=60, step=0.05, what="the frozen worker suspected")
            (suspect,) = await suspects(http)
            assert suspect["instance_id"] == victim_hex and "sent nothing" in suspect["reason"]
            # a request while it is frozen goes to the other worker, and its decision says why not the victim
            answer = await http.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "nvext": {"extra_fields": ["routing", "worker_id"]}})  # fmt: skip
            assert answer.status_code == 200, answer.text
            nvext = answer.json()["nvext"]
            assert nvext["worker_id"]["decode_worker_id"] == int(other_hex, 16)
            excluded = {c["instance_id"]: c.get("excluded") for c in nvext["routing"]["decode"]["candidates"]}
            assert excluded[int(victim_hex, 16)] == "suspected of hanging", nvext["routing"]
            df = await load  # every request finishes while the victim is still frozen
        finally:
            victim.send_signal(signal.SIGCONT)
        await until(lambda: _none(suspects(http)), timeout=60, step=0.05, what="the thawed worker cleared")
        metrics = (await http.get("/metrics")).text
    assert df["error"].isna().all(), df["error"].dropna().iloc[0]
    assert (df["output_tokens"] == TOKENS).all()  # nothing lost, nothing repeated
    assert metric_value(metrics, "dynamo_frontend_hung_instances_total", model="m") == 1
    assert metric_value(metrics, "dynamo_frontend_suspect_instances", model="m") == 0
    assert (metric_value(metrics, "dynamo_frontend_canaries_total", model="m", result="answered") or 0) == 1
    log = frontend.log_path.read_text()
    # its streams moved because the watchdog found it silent, not because its connection's heartbeat lapsed
    assert "suspected of hanging; its streams move" in log and "no frames or heartbeats" not in log, log[
        -3000:
    ]
    # the thawed worker is routed to again
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        served = {
            (await http.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "nvext": {"extra_fields": ["worker_id"]}})).json()["nvext"]["worker_id"]["decode_worker_id"]
            for _ in range(4)
        }  # fmt: skip
    assert int(victim_hex, 16) in served


async def _none(result: Any) -> bool:
    return not await result


async def test_past_the_migration_limit_a_hung_workers_streams_fail_cleanly(
    services: Any, start_worker: Any
) -> None:
    """With --migration-limit 0 the frozen worker's streams are not moved: each ends with an error
    that names the hang, while the worker is still frozen (no client waits for it); the other
    worker's requests complete."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp"]
    workers, frontend = await mockers_and_a_frontend(
        start_worker,
        bus,
        "hangonce.backend.generate",
        ("1", "1"),
        "--migration-limit",
        "0",
        "--router-mode",
        "round-robin",
    )
    victim_hex, victim = next(iter(workers.items()))
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        load = asyncio.create_task(
            bench.run(frontend.url, "m", concurrency=8, requests=8, max_tokens=400, ignore_eos=True,
                      progress=False, timeout=60)
        )  # fmt: skip
        await until(lambda: _streaming(http, 8), timeout=60, step=0.05, what="all eight streams streaming")
        victim.send_signal(signal.SIGSTOP)
        try:
            df = await load  # every stream ends while the victim is still frozen
        finally:
            victim.send_signal(signal.SIGCONT)
    failed, served = df[df["error"].notna()], df[df["error"].isna()]
    assert len(failed) == len(served) == 4, df[["worker", "error"]]  # round robin: half were on the victim
    assert failed["error"].str.contains(f"instance {victim_hex}").all(), failed["error"].iloc[0]
    assert failed["error"].str.contains("treated as hung").all(), failed["error"].iloc[0]
    assert (served["worker"] != victim_hex).all() and (served["output_tokens"] == 400).all()


async def _streaming(http: httpx.AsyncClient, count: int) -> bool:
    """Whether ``count`` requests of model m have had their first token (past it, a stream that
    stops moves by migration; before it, the request is simply sent elsewhere)."""
    text = (await http.get("/metrics")).text
    return (metric_value(text, "dynamo_frontend_time_to_first_token_seconds_count", model="m") or 0) >= count


async def test_a_worker_slowed_three_times_is_not_taken_for_hung(services: Any, start_worker: Any) -> None:
    """One worker runs at a third of the other's speed, with prompts short and long: its tokens come
    slower and its first tokens later, and the watchdog's expectation follows it."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp"]
    workers, frontend = await mockers_and_a_frontend(
        start_worker, bus, "slow.backend.generate", ("1", "0.333")
    )
    prompts = ["word " * words for words in (10, 200, 800, 40)]
    df = await bench.run(frontend.url, "m", prompts=prompts, concurrency=16, requests=64, max_tokens=TOKENS,
                         ignore_eos=True, progress=False, timeout=120)  # fmt: skip
    async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
        metrics = (await http.get("/metrics")).text
        assert await suspects(http) == []
    assert df["error"].isna().all() and (df["output_tokens"] == TOKENS).all()
    assert set(df["worker"]) == set(workers)  # both served
    assert (metric_value(metrics, "dynamo_frontend_hung_instances_total", model="m") or 0) == 0


async def test_a_frontend_whose_own_loop_stalls_blames_no_worker(tiny_path: Any) -> None:
    """The frontend's event loop blocked for longer than --hang-after while a worker streams: its
    tokens wait unread in the frontend, and the worker is not suspected."""
    from dynamo_nb import DistributedRuntime
    from dynamo_nb.disagg.modes import WorkerRole
    from dynamo_nb.engines.engine_worker import serve_engine
    from dynamo_nb.engines.mocker import MockerEngine
    from dynamo_nb.frontend import Frontend
    from dynamo_nb.frontend.watchdog import WatchdogConfig

    async with await DistributedRuntime.create() as runtime:
        engine = MockerEngine(speedup_ratio=1.0)
        await serve_engine(runtime, WorkerRole(), tiny_path, "m", lambda kv_events: engine)
        frontend = await Frontend.start(runtime, port=0, watchdog=WatchdogConfig(hang_after=0.3))
        try:
            await frontend.wait_for_model("m")
            async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
                body = {"model": "m", "prompt": "hi", "max_tokens": 200, "ignore_eos": True, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as response:
                    chunks = 0
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {")
                        if chunks == 5:
                            time.sleep(1.0)  # noqa: ASYNC251 - the point: this loop (the frontend's) blocked, 3x --hang-after
                assert chunks > 100
                assert await suspects(http) == []
                metrics = (await http.get("/metrics")).text
            assert (metric_value(metrics, "dynamo_frontend_hung_instances_total", model="m") or 0) == 0
        finally:
            await frontend.stop()
            await engine.close()


@pytest.mark.parametrize("frozen", ["prefill", pytest.param("decode", marks=pytest.mark.long)])
async def test_a_frozen_prefill_or_decode_worker_costs_its_requests_no_wait(
    frozen: str, services: Any, start_worker: Any, tmp_path: Path
) -> None:
    """Two workers of the frozen role and one of the other, prefill/decode on the fast path (the
    decode fetches its KV from the prefill's bootstrap server): every request completes while the
    frozen worker is still frozen, so none waited for it (a frozen prefill's decode does not wait
    out its --kv-timeout: the prefill's stream is given up and the request served otherwise); the
    request trace says why each request the frozen prefill held was served aggregated."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp"]
    roles = {"prefill": "--prefill-endpoint", "decode": "--endpoint"}
    endpoints = [
        "--endpoint",
        f"pd{frozen}.backend.generate",
        "--prefill-endpoint",
        f"pd{frozen}.prefill.generate",
    ]
    counts = {"prefill": 2 if frozen == "prefill" else 1, "decode": 2 if frozen == "decode" else 1}
    workers = {
        role: [
            await start_worker(
                *bus,
                *endpoints,
                "--lease-ttl",
                "30",
                "--speedup-ratio",
                "1",
                "--mode",
                role,
                script=MOCKER_WORKER,
            )
            for _ in range(counts[role])
        ]
        for role in roles
    }
    port = free_port()
    trace = tmp_path / "trace.jsonl"
    frontend = await start_worker(
        *bus, "--http-port", str(port), "--request-trace", str(trace), script=FRONTEND
    )
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", instances=counts["decode"])
    victim = workers[frozen][0]
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await until(
            lambda: _prefill_instances(http, counts["prefill"]), timeout=30, what="both prefill workers"
        )
        load = asyncio.create_task(
            bench.run(
                url,
                "tiny-llama",
                concurrency=8,
                requests=120,
                max_tokens=16,
                ignore_eos=True,
                progress=False,
                timeout=60,
            )
        )
        await until(lambda: _served(http), timeout=60, step=0.05, what="requests before the freeze")
        victim.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: suspects(http), timeout=60, step=0.05, what="the frozen worker suspected")
            df = await load  # all of it while the victim is frozen
            listed = await suspects(http)
            assert len(listed) == 1, frontend.log_path.read_text()[-6000:]
            (suspect,) = listed
            metrics = (await http.get("/metrics")).text
        finally:
            victim.send_signal(signal.SIGCONT)
        await until(lambda: _none(suspects(http)), timeout=60, step=0.05, what="the thawed worker cleared")
    assert suspect["instance_id"] == f"{victim.instance_id:x}"
    assert df["error"].isna().all(), df["error"].dropna().iloc[0]
    assert (df["output_tokens"] == 16).all()
    assert metric_value(metrics, "dynamo_frontend_hung_instances_total", model="tiny-llama") == 1
    log = frontend.log_path.read_text()
    assert "no frames or heartbeats" not in log and "did not answer for room" not in log, log[-3000:]
    if (
        frozen == "prefill"
    ):  # the requests it held went aggregated, saying why; later ones to the other prefill
        assert "prefill → decode handoff failed: the prefill on" in log and "treated as hung" in log
        served_by_victim = df[df["prefill_worker"] == f"{victim.instance_id:x}"]
        assert len(served_by_victim) < len(df)
        # the decision record of each request it held: served aggregated, because it was hung
        await until(lambda: _lines(trace) >= len(df), timeout=30, step=0.05, what="every request traced")
        records = [json.loads(line)["request"] for line in trace.read_text().splitlines()]
        aggregated = [r for r in records if r["path"] == "aggregated" and r["status"] == "success"]
        assert aggregated and all(
            f"{victim.instance_id:x}" in r["aggregated_because"]
            and "treated as hung" in r["aggregated_because"]
            for r in aggregated
        ), aggregated[:2]


def _lines(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


async def _prefill_instances(http: httpx.AsyncClient, count: int) -> bool:
    return len((await http.get("/health")).json()["prefill_instances"]) >= count


async def _served(http: httpx.AsyncClient) -> bool:
    text = (await http.get("/metrics")).text
    return (
        metric_value(text, "dynamo_frontend_requests_total", model="tiny-llama", status="success") or 0
    ) > 0
