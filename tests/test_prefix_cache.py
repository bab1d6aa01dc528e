"""The hf engine's prefix cache: the same tokens as without it, reuse of full blocks, LRU
eviction from a prefix's tail, KV events a router follows, and KV routing to the worker that
holds a prompt's blocks."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import collect, req

from dynamo_nb import DistributedRuntime
from dynamo_nb.engines import HFEngine, stats_handler
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import serve_llm
from dynamo_nb.router.kv import KvEventPublisher, KvRouterConfig, RadixTree, block_hashes

SHARED = [random.Random(3).randrange(3, 500) for _ in range(40)]  # 10 blocks of 4


def greedy(prompt: list[int], max_tokens: int = 6) -> dict[str, Any]:
    return {
        "token_ids": prompt,
        "stop_conditions": {"max_tokens": max_tokens},
        "sampling_options": {"temperature": 0},
    }


def tokens(items: list[Any]) -> list[int]:
    return [t for item in items for t in item["token_ids"]]


@pytest.fixture(scope="module")
async def plain(tiny_path: Path) -> Any:
    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=0)
    yield engine
    await engine.close()


async def cached_engine(tiny_path: Path, blocks: int) -> tuple[HFEngine, list[Any]]:
    events: list[Any] = []

    async def publish(event: Any) -> None:
        events.append(event)

    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=blocks, block_size=4, kv_events=publish)
    return engine, events


async def test_a_cached_prefix_gives_the_same_tokens_and_counts_as_hits(plain: Any, tiny_path: Path) -> None:
    engine, events = await cached_engine(tiny_path, 64)
    try:
        for tail in ([1, 2, 3], [7, 8, 9, 10, 11], [], [5]):  # [] : all 10 blocks cached, 39 tokens reused
            prompt = SHARED + tail
            assert tokens(await collect(engine.generate(req(greedy(prompt))))) == tokens(
                await collect(plain.generate(req(greedy(prompt))))
            )
        assert engine.stats()["prefix_hits"] == 30 and engine.stats()["prompt_blocks"] == 41
        assert engine.stats()["cached_blocks"] == 11  # the 10 shared blocks and [7, 8, 9, 10]'s block
        assert [list(e) for e in events] == [["stored"], ["stored"]]
        assert [len(e["stored"]["blocks"]) for e in events] == [10, 1]
        assert events[1]["stored"]["parent_hash"] == events[0]["stored"]["blocks"][-1]["block_hash"]
        index = RadixTree()  # the events, and the kv_sync snapshot, describe the same cache
        for event in events:
            index.apply_event("w", event)
        rebuilt = RadixTree()
        for event in engine.kv_snapshot():
            rebuilt.apply_event("w", event)
        probe = block_hashes([*SHARED, 7, 8, 9, 10], 4)
        assert index.find_matches(probe).scores == rebuilt.find_matches(probe).scores == {"w": 11}
        sampled = {**greedy([*SHARED, 4]), "sampling_options": {"temperature": 1.0, "seed": 5}}
        assert tokens(await collect(engine.generate(req(sampled)))) == tokens(
            await collect(plain.generate(req(sampled)))
        )
    finally:
        await engine.close()


async def test_a_full_cache_evicts_from_a_prefix_tail_and_frees_its_tensors(tiny_path: Path) -> None:
    engine, events = await cached_engine(tiny_path, 4)
    try:
        first = list(range(10, 26))  # 4 blocks: the whole cache
        await collect(engine.generate(req(greedy(first, 2))))
        await collect(engine.generate(req(greedy(list(range(100, 108)), 2))))  # 2 new blocks: evict 2
        assert [list(e) for e in events] == [["stored"], ["removed"], ["stored"]]
        stored, removed = events[0]["stored"]["blocks"], events[1]["removed"]["block_hashes"]
        assert removed == [stored[3]["block_hash"], stored[2]["block_hash"]]  # the tail first
        assert engine.stats()["cached_blocks"] == 4
        await collect(engine.generate(req(greedy(first, 2))))  # the head of the prefix is still cached
        assert engine.stats()["prefix_hits"] == 2
        too_long = list(range(200, 240))  # 10 blocks never fit 4: computed, not cached, no error
        assert len(tokens(await collect(engine.generate(req(greedy(too_long, 2)))))) == 2
    finally:
        await engine.close()


async def test_kv_router_follows_the_hf_prefix_cache_events(tiny_path: Path) -> None:
    """Routing by the engines' KV events alone (no pending guesses): a prompt's repeats go to
    the hf worker whose prefix cache holds it, and hit there."""
    runtimes = [await DistributedRuntime.create() for _ in range(2)]
    engines = []
    try:
        for runtime in runtimes:
            endpoint = runtime.endpoint("pc.backend.generate")
            publisher = await KvEventPublisher.for_worker(runtime, endpoint.component())
            assert publisher is not None
            engine = await HFEngine.load(
                tiny_path, prefix_cache_blocks=256, block_size=4, kv_events=publisher.publish
            )
            engines.append(engine)
            await publisher.serve_sync(engine.kv_snapshot)
            await serve_llm(endpoint, engine.generate, tiny_path, model_name="pc", kv_cache_block_size=4)
            await endpoint.component().endpoint("stats").serve(stats_handler(engine.stats))
        config = KvRouterConfig(pending_ttl=0.0)  # only the workers' events say what is cached
        frontend = await Frontend.start(runtimes[0], port=0, router_mode="kv", kv=config)
        await frontend.wait_for_model("pc")
        router = frontend.models.get("pc").router
        for _ in range(100):
            if len(router.client.instance_ids()) == 2:
                break
            await asyncio.sleep(0.02)

        cached: list[int] = []  # usage.prompt_tokens_details.cached_tokens of each answer

        async def served_by(http: httpx.AsyncClient, prompt: list[int]) -> int:
            body = {
                "model": "pc",
                "prompt": prompt,
                "max_tokens": 2,
                "nvext": {"extra_fields": ["worker_id"]},
            }
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            return response.json()["nvext"]["worker_id"]["decode_worker_id"]

        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            holder = await served_by(http, [*SHARED, 1])
            hashes = block_hashes(SHARED, 4)
            for _ in range(200):  # the stored event reaches the router's indexer
                if router.tree.find_matches(hashes).scores.get(holder) == 10:
                    break
                await asyncio.sleep(0.02)
            assert router.tree.find_matches(hashes).scores == {holder: 10}
            assert [await served_by(http, [*SHARED, 2 + i]) for i in range(3)] == [holder] * 3
        # what the engine says it reused is what the router predicted: the 10 shared blocks of 4
        assert cached == [0, 40, 40, 40]
        by_id = {runtime.connection_id: engine for runtime, engine in zip(runtimes, engines, strict=True)}
        assert by_id[holder].stats()["prefix_hits"] == 30  # 3 repeats × 10 cached blocks
        assert all(e.stats()["prefix_hits"] == 0 for worker, e in by_id.items() if worker != holder)
        await frontend.stop()
    finally:
        for runtime in runtimes:
            await runtime.shutdown()
        for engine in engines:
            await engine.close()
