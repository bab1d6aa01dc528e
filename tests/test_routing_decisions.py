"""Every routed request explains itself: mocker worker processes (over etcd, KV events over NATS)
behind frontends of each router. The decision an answer carries (``nvext.extra_fields:
["routing"]``) and the one the frontend keeps name the instance that served the request; the
KV router's predicted reuse matches what the engine reports in ``usage.prompt_tokens_details``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from helpers import MOCKER_WORKER, RuntimeFactory

from dynamo_nb import bench
from dynamo_nb.frontend import Frontend
from dynamo_nb.router.kv.router import KvRouterConfig
from dynamo_nb.runtime import parse_ready_line

pytestmark = pytest.mark.timeout(180)

BLOCK = 4
ASKED = {"extra_fields": ["routing", "worker_id"]}


async def ask(http: httpx.AsyncClient, prompt: list[int], **nvext: Any) -> dict[str, Any]:
    """One completion that asks why it went where it did; its answer, checked for consistency."""
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 3, "nvext": {**ASKED, **nvext}}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    request_id = response.headers["x-request-id"]
    assert answer["id"] == f"cmpl-{request_id}"
    decision = answer["nvext"]["routing"]["decode"]
    served_by = answer["nvext"]["worker_id"]["decode_worker_id"]
    assert decision["chosen"] == served_by and decision["request_id"] == request_id
    assert any(c["instance_id"] == served_by and "excluded" not in c for c in decision["candidates"])
    return answer


async def test_each_router_records_the_instance_that_served(
    services: Any, start_worker: Any, make_runtime: RuntimeFactory
) -> None:
    flags = [
        "--discovery",
        services.etcd_url,
        "--nats-url",
        services.nats_url,
        "--endpoint",
        "why.backend.generate",
    ]
    mocker = await start_worker(*flags, "--num-workers", "2", "--kv-cache-block-size", str(BLOCK),
                                "--speedup-ratio", "50", script=MOCKER_WORKER)  # fmt: skip
    workers = sorted(int(i, 16) for i in parse_ready_line(mocker.ready_line)[1]["instance"].split(","))
    runtime = await make_runtime("etcd-tcp")

    def second_one(request: Any, instance_ids: list[int]) -> int:
        return sorted(instance_ids)[-1]

    setups = {  # KV first: the workers' caches hold nothing its router has not seen
        "kv": {"router_mode": "kv", "kv": KvRouterConfig()}, "round-robin": {}, "random": {"router_mode": "random"},
        "least-loaded": {"router_mode": "least-loaded"}, "policy:second_one": {"router_policy": second_one},
    }  # fmt: skip
    for router, options in setups.items():
        frontend = await Frontend.start(runtime, port=0, **options)
        try:
            await frontend.wait_for_model("tiny-llama", timeout=30)
            served = frontend.models.get("tiny-llama")
            for _ in range(200):
                if len(served.client.instance_ids()) == 2:
                    break
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
                answers = [await ask(http, list(range(300 + 9 * i, 340 + 9 * i))) for i in range(4)]
                for answer in answers:
                    decision = answer["nvext"]["routing"]["decode"]
                    assert decision["router"] == router and decision["hop"] == "decode"
                    assert sorted(c["instance_id"] for c in decision["candidates"]) == workers
                    kept = frontend.routing_records.get(answer["id"].removeprefix("cmpl-"))
                    assert kept is not None and kept.to_dict() == decision
                    # people read the ids as READY lines print them: hex, in the table and the sentence
                    assert f" chose {decision['chosen']:x} " in kept.explain()
                assert {row["instance"] for row in frontend.routing_records.rows()} == {
                    f"{w:x}" for w in workers
                }
                chosen = [a["nvext"]["routing"]["decode"]["chosen"] for a in answers]
                if router == "round-robin":
                    assert chosen[0] != chosen[1] and chosen[:2] == chosen[2:]  # in turn
                    pinned = await ask(
                        http, [5, 6, 7], backend_instance_id=f"{workers[0]:x}"
                    )  # as /health shows it
                    decision = pinned["nvext"]["routing"]["decode"]
                    assert decision["router"] == "direct" and decision["chosen"] == workers[0]
                    assert [
                        c.get("excluded") for c in decision["candidates"] if c["instance_id"] == workers[1]
                    ] == ["the request named another instance"]
                if router == "policy:second_one":
                    assert chosen == [workers[1]] * 4
                if router == "least-loaded":
                    for answer in answers:
                        scored = answer["nvext"]["routing"]["decode"]["candidates"]
                        assert all("inflight" in c["parts"] for c in scored)
                if router == "kv":
                    await check_kv_explains_reuse(http, frontend)
        finally:
            await frontend.stop()


async def check_kv_explains_reuse(http: httpx.AsyncClient, frontend: Frontend) -> None:
    """A prompt built to miss (new tokens) is predicted and found uncached; its repeats are
    predicted to hit its whole shared blocks on the worker that holds them, and that worker
    reports reusing exactly those tokens, by a margin the decision states."""
    shared = list(range(1000, 1000 + 16 * BLOCK))  # 16 whole blocks
    first = await ask(http, [*shared, 1])
    first_decision = first["nvext"]["routing"]["decode"]
    assert all(c["parts"]["overlap_blocks"] == 0 for c in first_decision["candidates"])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the miss, predicted and real
    holder = first_decision["chosen"]
    await asyncio.sleep(0.3)  # the worker's stored event crosses NATS
    for suffix in (2, 3):
        again = await ask(http, [*shared, suffix])
        decision = again["nvext"]["routing"]["decode"]
        assert decision["chosen"] == holder and decision["margin"] > 0 and not decision["tie"]
        [mine] = [c for c in decision["candidates"] if c["instance_id"] == holder]
        predicted = mine["parts"]["overlap_blocks"] * BLOCK
        assert predicted == len(shared)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == predicted  # the hit, as predicted
        [other] = [c for c in decision["candidates"] if c["instance_id"] != holder]
        assert other["parts"]["overlap_blocks"] == 0 and other["score"] - mine["score"] == decision["margin"]
    table = frontend.routing_records.table()
    assert {"overlap_blocks", "cost", "chosen", "margin"} <= set(table.columns)

    # a run joined with its decisions: every request's predicted prefix is what its engine reused
    runs = await bench.run(frontend.url, "tiny-llama", prompts=bench.shared_prefix_prompts(6, system_words=60),
                           concurrency=1, requests=6, max_tokens=2, progress=False)  # fmt: skip
    joined = bench.with_routing(runs, frontend.routing_records)
    assert (joined["router"] == "kv").all() and joined["request_id"].notna().all()
    assert (joined["cached_tokens"] == joined["prefix_tokens"]).all(), joined[
        ["cached_tokens", "prefix_tokens"]
    ]
    assert joined["cached_tokens"].iloc[1:].gt(0).all()  # the shared system prompt, found after the first

    metrics = await bench.scrape_metrics(frontend.url)
    funnel = metrics[metrics["name"] == "dynamo_frontend_kv_reuse_tokens_total"].set_index("stage")["value"]
    assert funnel["input"] >= funnel["seen_before"] >= funnel["best_prefix"] >= funnel["chosen_prefix"] > 0
    assert funnel["reused"] == funnel["chosen_prefix"]  # predicted and reported agree over the whole run
    total = bench.histogram(metrics, "dynamo_router_overhead_total_ms", worker_type="decode")
    assert total["count"].iloc[-1] >= 9 and total["share"].iloc[-1] == 1.0  # every KV decision timed


async def test_a_disaggregated_request_explains_both_hops(services: Any, start_worker: Any) -> None:
    """The prefill router's decision names the prefill worker that ran the prefill, the decode
    router's the decode worker (``x-dynamo-prefill-worker``, ``nvext.worker_id``)."""
    from helpers import FRONTEND, free_port

    from dynamo_nb import bench

    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--kv-cache-block-size", str(BLOCK),
           "--speedup-ratio", "50", "--endpoint", "whyd.backend.generate", "--prefill-endpoint", "whyd.prefill.generate"]  # fmt: skip
    await start_worker(*bus, "--mode", "prefill", "--num-workers", "2", script=MOCKER_WORKER)
    await start_worker(*bus, "--mode", "decode", script=MOCKER_WORKER)
    port = free_port()
    await start_worker(*bus[:4], "--http-port", str(port), "--router-mode", "kv", script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for i in range(3):
            answer = await ask(http, list(range(500 + 40 * i, 540 + 40 * i)))
            routing = answer["nvext"]["routing"]
            assert routing["prefill"]["hop"] == "prefill" and routing["prefill"]["router"] == "kv"
            assert routing["prefill"]["chosen"] == answer["nvext"]["worker_id"]["prefill_worker_id"]
            assert routing["prefill"]["request_id"] == routing["decode"]["request_id"]
            assert len(routing["prefill"]["candidates"]) == 2


def test_a_decision_s_knobs_and_queue_are_columns_of_its_rows() -> None:
    """A KV decision's policy and the frontend's queue fields reach `rows()` (and so
    `bench.with_routing`) as a column each; a decision without them adds none."""
    from dynamo_nb.router.decision import Candidate, RoutingDecision, RoutingRecords

    records = RoutingRecords(8)
    kv = RoutingDecision("kv", 1, [Candidate(1, 3.0), Candidate(2, 5.0)], request_id="a",
                         policy={"overlap_score_credit": 0.0, "prefill_load_scale": 4.0, "temperature": 0.0},
                         queue={"priority": 2.0, "strict_priority": 1, "waited_ms": 12.5})  # fmt: skip
    records.add(kv)
    records.add(RoutingDecision("round-robin", 2, [Candidate(2)], request_id="b"))
    rows = {row["request_id"]: row for row in records.rows() if row["chosen"]}
    assert rows["a"]["prefill_load_scale"] == 4.0 and rows["a"]["strict_priority"] == 1
    assert rows["a"]["waited_ms"] == 12.5 and rows["a"]["margin"] == 2.0
    assert "prefill_load_scale" not in rows["b"] and "waited_ms" not in rows["b"]
