"""KV-aware routing, the pure parts: block hashes against xxhash by Dynamo's rule, the radix-tree
indexer on worked examples, the cost function and the pick."""

from __future__ import annotations

import asyncio
import random
import struct
from typing import Any

import httpx
import pytest
import xxhash

from dynamo_nb import ConfigError, DistributedRuntime, LocalServices, NoInstancesError, bench
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import serve_llm
from dynamo_nb.router.kv import (
    HASH_SEED,
    ActiveLoad,
    KvEventPublisher,
    KvIndexer,
    KvRouter,
    KvRouterConfig,
    RadixTree,
    block_hashes,
    costs,
    pick,
    sequence_hashes,
)
from dynamo_nb.router.policy import RouterPolicy


def reference_local(tokens: list[int]) -> int:
    """The rule, written out independently: u32 little-endian bytes, XXH3-64, seed 1337."""
    return xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in tokens), seed=1337)


def test_block_hashes_follow_dynamos_rule() -> None:
    rng = random.Random(5)
    tokens = [rng.randrange(0, 150_000) for _ in range(70)]
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 4  # 64 tokens in full blocks; the 6-token tail never counts
    assert hashes == [reference_local(tokens[i : i + 16]) for i in range(0, 64, 16)]
    assert block_hashes(tokens[:64], 16) == hashes and block_hashes(tokens[:15], 16) == []
    assert HASH_SEED == 1337
    # a known vector: one block of token ids 0..15
    assert block_hashes(list(range(16)), 16) == [reference_local(list(range(16)))]
    assert block_hashes([2**32 - 1] * 4, 4) == [reference_local([2**32 - 1] * 4)]


def test_sequence_hashes_chain_the_prefix() -> None:
    locals_ = block_hashes(list(range(48)), 16)
    chained = sequence_hashes(locals_)
    assert chained[0] == locals_[0]
    for i in (1, 2):
        expected = xxhash.xxh3_64_intdigest(struct.pack("<QQ", chained[i - 1], locals_[i]), seed=1337)
        assert chained[i] == expected
    # the same block after a different prefix is a different sequence block
    other = block_hashes([9] * 16 + list(range(16, 32)), 16)
    assert other[1] == locals_[1] and sequence_hashes(other)[1] != chained[1]


def test_a_lora_changes_the_seed() -> None:
    seed = (1337 + xxhash.xxh3_64_intdigest(b"my-lora")) % 2**64
    expected = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in range(16)), seed=seed)
    assert block_hashes(list(range(16)), 16, lora_name="my-lora") == [expected]
    assert block_hashes(list(range(16)), 16, lora_name="my-lora") != block_hashes(list(range(16)), 16)


def stored(parent: int | None, *pairs: tuple[int, int]) -> dict:
    return {
        "stored": {"parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in pairs]}
    }


def test_indexer_worked_example() -> None:
    index = RadixTree()
    # worker A holds blocks with contents 10, 20, 30; worker B holds 10, 20, then 40
    index.apply_event("A", stored(None, (101, 10), (102, 20)))
    index.apply_event("A", stored(102, (103, 30)))
    index.apply_event("B", stored(None, (201, 10), (202, 20), (203, 40)))
    matches = index.find_matches([10, 20, 30, 50])
    assert matches.scores == {"A": 3, "B": 2}
    assert matches.tree_sizes == {"A": 3, "B": 3}
    assert index.find_matches([10, 20, 40]).scores == {"A": 2, "B": 3}
    assert index.find_matches([20, 30]).scores == {}  # not a prefix: no match
    # overlap is consecutive from the start: B's block 40 does not count after a miss
    assert index.find_matches([10, 99, 40]).scores == {"A": 1, "B": 1}

    index.apply_event("A", {"removed": {"block_hashes": [102]}})  # evicted mid-chain
    assert index.find_matches([10, 20, 30]).scores == {"A": 1, "B": 2}
    index.apply_event("B", "cleared")
    assert index.find_matches([10, 20, 40]).scores == {"A": 1}
    assert index.workers() == ["A"] and index.block_count() == 2
    assert index.events_applied == 5


def test_indexer_drops_a_stored_event_after_a_gap_and_forgets_dead_workers() -> None:
    index = RadixTree()
    index.apply_event("A", stored(555, (1, 10)))  # parent never reported: a gap
    assert index.events_dropped == 1 and index.find_matches([10]).scores == {}
    index.apply_event("A", stored(None, (1, 10), (2, 20)))
    index.apply_event("C", stored(None, (7, 10)))
    index.remove_worker("A")
    assert index.find_matches([10, 20]).scores == {"C": 1} and index.block_count("A") == 0
    index.remove_worker("C")
    assert index._root.children == {}  # empty branches are pruned
    with pytest.raises(ValueError, match="not a KV event"):
        index.apply_event("A", {"moved": {}})


def test_approximate_mode_inserts_routed_blocks_with_a_ttl() -> None:
    index = RadixTree()
    shared = block_hashes(list(range(64)), 16)
    index.insert("w1", shared, ttl=10, now=100.0)
    index.insert("w2", shared[:2], ttl=10, now=105.0)
    assert index.find_matches(shared).scores == {"w1": 4, "w2": 2}
    assert index.expire(now=109.0) == 0
    assert index.expire(now=110.0) == 4  # w1's four blocks
    assert index.find_matches(shared).scores == {"w2": 2}
    assert index.expire(now=200.0) == 2 and index.block_count() == 0


def test_a_prefix_routed_again_lives_longer_and_expires_once() -> None:
    index = RadixTree()
    shared = block_hashes(list(range(64)), 16)
    index.insert("w", shared, ttl=10, now=0.0)
    index.insert("w", shared[:2], ttl=10, now=8.0)  # two of its blocks routed again: until 18
    assert index.expire(now=10.0) == 2 and index.find_matches(shared).scores == {"w": 2}
    index.remove("w", [sequence_hashes(shared)[1]])  # an event removed one meanwhile
    assert index.expire(now=18.0) == 1 and index.block_count() == 0
    assert index.expire(now=100.0) == 0


def test_find_matches_scores_where_each_workers_prefix_ends() -> None:
    index = RadixTree()
    hashes = block_hashes(list(range(80)), 16)  # 5 blocks
    index.insert("a", hashes, ttl=60, now=0.0)
    index.insert("b", hashes[:3], ttl=60, now=0.0)
    index.insert("c", hashes[:1], ttl=60, now=0.0)
    index.insert("d", block_hashes(list(range(100, 132)), 16), ttl=60, now=0.0)
    matches = index.find_matches(hashes)
    assert matches.scores == {"a": 5, "b": 3, "c": 1}
    assert matches.tree_sizes == {"a": 5, "b": 3, "c": 1, "d": 2}
    assert index.find_matches([*hashes[:2], 12345]).scores == {"a": 2, "b": 2, "c": 1}


def busy(blocks: int) -> ActiveLoad:
    """A worker running one request that holds ``blocks`` distinct blocks."""
    load = ActiveLoad()
    load.add("running", 0, [10_000 + i for i in range(blocks)])
    return load


def test_a_stored_event_confirms_a_predicted_block() -> None:
    index = RadixTree()
    hashes = block_hashes(list(range(16)), 4)
    index.insert("w", hashes, ttl=5, now=0.0)  # routed: predicted for 5 s
    ids = sequence_hashes(hashes)
    index.apply_event("w", stored(None, *zip(ids[:2], hashes[:2], strict=True)))  # the worker confirms two
    assert index.expire(now=10.0) == 2  # only the unconfirmed two expire
    assert index.find_matches(hashes).scores == {"w": 2}


def test_routing_again_to_a_confirmed_prefix_does_not_make_it_expire() -> None:
    index = RadixTree()
    hashes = block_hashes(list(range(16)), 4)
    ids = sequence_hashes(hashes)
    index.apply_event("w", stored(None, *zip(ids, hashes, strict=True)))  # the worker holds all four
    index.insert("w", hashes, ttl=5, now=0.0, block_ids=ids)  # a request routed there again
    assert index.expire(now=10.0) == 0 and index.find_matches(hashes).scores == {"w": 4}


def test_cost_function_worked_example_from_dynamos_docs() -> None:
    """Costs 8+10=18, 5+5=10 and 2+9=11: the second worker is chosen."""
    loads = {"a": busy(2), "b": ActiveLoad(), "c": busy(7)}
    worker_costs = costs(
        ["a", "b", "c"], prompt_tokens=128, block_size=16, overlaps={"b": 3, "c": 6}, loads=loads
    )
    assert worker_costs == {"a": 18.0, "b": 10.0, "c": 11.0}
    assert pick(worker_costs) == "b"
    heavier = costs(["a", "b", "c"], prompt_tokens=128, block_size=16, overlaps={"b": 3, "c": 6}, loads=loads,
                    prefill_load_scale=2.0)  # fmt: skip
    assert heavier == {"a": 26.0, "b": 15.0, "c": 13.0} and pick(heavier) == "c"
    blind = costs(["a", "b", "c"], prompt_tokens=128, block_size=16, overlaps={"b": 3, "c": 6}, loads=loads,
                  overlap_score_credit=0.0)  # fmt: skip
    assert blind == {"a": 18.0, "b": 13.0, "c": 17.0}  # the caches ignored: only the loads differ
    eager = costs(["a", "b", "c"], prompt_tokens=128, block_size=16, overlaps={"b": 3, "c": 6}, loads=loads,
                  overlap_score_credit=2.0)  # fmt: skip
    assert eager == {"a": 18.0, "b": 7.0, "c": 5.0} and pick(eager) == "c"  # a cached block twice as good


def test_pick_breaks_ties_by_cache_size_then_at_random_and_samples_with_temperature() -> None:
    assert pick({"a": 1.0, "b": 1.0}, tree_sizes={"a": 9, "b": 3}) == "b"
    rng = random.Random(0)
    assert {pick({"a": 1.0, "b": 1.0}, rng=rng) for _ in range(50)} == {"a", "b"}  # fair among equals
    draws = [pick({"cheap": 0.0, "dear": 10.0}, temperature=0.5, rng=rng) for _ in range(2000)]
    assert draws.count("cheap") > 3 * draws.count("dear") > 0  # mostly cheap, not only
    with pytest.raises(NoInstancesError, match="no workers"):
        pick({})


def test_active_load_follows_a_request_and_counts_shared_blocks_once() -> None:
    load = ActiveLoad()
    load.add("r1", new_tokens=100, sequence=[1, 2, 3, 4])
    load.add("r2", new_tokens=20, sequence=[1, 2, 3, 9])  # shares a 3-block prefix with r1
    assert (load.prefill_tokens, load.decode_blocks) == (120, 5)
    assert load.new_blocks([1, 2, 7, 8]) == 2
    load.prefill_done("r1")
    assert (load.prefill_tokens, load.decode_blocks) == (20, 5)
    load.free("r1")
    assert load.decode_blocks == 4  # the shared blocks stay in use by r2
    load.free("r2")
    load.free("unknown")
    assert (load.prefill_tokens, load.decode_blocks, load.requests) == (0, 0, {})


def test_a_shared_prefix_in_use_adds_no_decode_load() -> None:
    shared = [1, 2, 3, 4, 5, 6]
    running = ActiveLoad()
    running.add("r", 0, shared)  # a worker already running a request with this prefix
    worker_costs = costs(
        ["holder", "idle"], prompt_tokens=112, block_size=16, overlaps={"holder": 6}, loads={"holder": running},
        sequence=[*shared, 7],
    )  # fmt: skip
    assert worker_costs == {"holder": 1.0 + 7.0, "idle": 7.0 + 7.0}


class BlockCache:
    """A worker's cache in a test: which blocks it holds, as the events that rebuild it."""

    def __init__(self) -> None:
        self.chains: dict[int, tuple[int | None, int]] = {}  # block id → (parent id, tokens hash)

    def store(self, parent: int | None, pairs: list[tuple[int, int]]) -> list[dict[str, int]]:
        for block, tokens in pairs:
            self.chains[block] = (parent, tokens)
            parent = block
        return [{"block_hash": b, "tokens_hash": t} for b, t in pairs]

    def snapshot(self) -> list[dict]:
        return [
            {"stored": {"parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t}]}}
            for b, (parent, t) in self.chains.items()
        ]


async def until(condition: Any, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


async def test_kv_events_reach_the_indexer_and_a_lost_event_is_repaired() -> None:
    worker_rt, router_rt = await DistributedRuntime.create(), await DistributedRuntime.create()
    try:
        cache = BlockCache()
        worker_id = worker_rt.connection_id
        publisher = KvEventPublisher(worker_rt.namespace("kvt").component("backend"), worker_id)
        await publisher.serve_sync(cache.snapshot)
        indexer = await KvIndexer.start(router_rt.namespace("kvt").component("backend"))
        await publisher.stored(None, cache.store(None, [(1, 10), (2, 20)]))
        assert await until(lambda: indexer.tree.find_matches([10, 20]).scores == {worker_id: 2})

        # block 30 is stored but its event is lost; the next event reveals the gap and the indexer re-syncs
        cache.store(2, [(3, 30)])
        publisher.event_id += 1  # the event that never arrives
        await publisher.stored(3, cache.store(3, [(5, 50)]))
        assert await until(lambda: indexer.gaps_repaired == 1)
        assert indexer.tree.find_matches([10, 20, 30, 50]).scores == {worker_id: 4}
        await publisher.removed([5])
        del cache.chains[5]
        assert await until(lambda: indexer.tree.find_matches([10, 20, 30, 50]).scores == {worker_id: 3})
        assert indexer.prune(set()) == [worker_id] and indexer.tree.block_count() == 0
        await indexer.stop()
    finally:
        await worker_rt.shutdown()
        await router_rt.shutdown()


async def test_kv_events_over_nats_between_runtimes(services: LocalServices) -> None:
    make = lambda: DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)  # noqa: E731
    worker_rt, router_rt = await make(), await make()
    try:
        cache = BlockCache()
        publisher = KvEventPublisher(worker_rt.namespace("kvn").component("backend"), worker_rt.connection_id)
        await publisher.serve_sync(cache.snapshot)
        indexer = await KvIndexer.start(router_rt.namespace("kvn").component("backend"))
        hashes = block_hashes(list(range(48)), 16)
        await publisher.stored(None, cache.store(None, list(zip([101, 102, 103], hashes, strict=True))))
        assert await until(lambda: indexer.tree.find_matches(hashes).scores == {worker_rt.connection_id: 3})
        await publisher.cleared()
        assert await until(lambda: indexer.tree.block_count() == 0)
        await indexer.stop()
    finally:
        await worker_rt.shutdown()
        await router_rt.shutdown()


async def test_events_across_processes_need_nats(services: LocalServices) -> None:
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp")
    try:
        with pytest.raises(ConfigError, match="over NATS: create the runtime with nats_url"):
            await runtime.namespace("x").component("y").publish_event("kv_events", {})
    finally:
        await runtime.shutdown()


async def kv_frontend(tiny_path: Any, config: KvRouterConfig, namespace: str):
    """Two echo workers of one model (a runtime each, block size 4) behind a frontend in kv mode."""
    workers = [await DistributedRuntime.create() for _ in range(2)]
    for runtime in workers:
        endpoint = runtime.endpoint(f"{namespace}.backend.generate")
        await serve_llm(
            endpoint, EchoEngine().generate, tiny_path, model_name=namespace, kv_cache_block_size=4
        )
    front = await DistributedRuntime.create()
    frontend = await Frontend.start(front, port=0, router_mode="kv", kv=config)
    await bench.wait_for_model(frontend.url, namespace, instances=2, timeout=10)
    return workers, front, frontend


async def served_by(http: Any, model: str, prompt: list[int]) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "nvext": {"extra_fields": ["worker_id"]}}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["nvext"]["worker_id"]["decode_worker_id"]


async def test_kv_router_sends_a_repeated_prefix_back_approximate_mode(tiny_path: Any) -> None:
    workers, front, frontend = await kv_frontend(tiny_path, KvRouterConfig(use_kv_events=False), "kva")
    try:
        shared = list(range(10, 42))  # 8 blocks of 4
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            first = await served_by(http, "kva", [*shared, 1, 2, 3, 4])
            assert await served_by(http, "kva", [*shared, 5, 6, 7, 8]) == first  # same prefix, same worker
            other = await served_by(http, "kva", list(range(100, 132)))  # nothing cached: the idle cache wins
            assert other != first
            assert await served_by(http, "kva", [*shared, 9, 9, 9, 9]) == first
        router = frontend.models.get("kva").router
        assert (router.decisions, router.hit_blocks, router.prompt_blocks_total) == (
            4,
            16,
            35,
        )  # 0+8+0+8 of 9+9+8+9
        assert all(load.decode_blocks == 0 and load.prefill_tokens == 0 for load in router.loads.values())
        await frontend.stop()
    finally:
        for runtime in [*workers, front]:
            await runtime.shutdown()


async def test_kv_router_follows_the_workers_kv_events(tiny_path: Any) -> None:
    workers, front, frontend = await kv_frontend(tiny_path, KvRouterConfig(), "kve")
    try:
        # the second worker announces that it holds the prompt's first 6 blocks
        holder = workers[1]
        prompt = list(range(200, 232))
        hashes = block_hashes(prompt, 4)[:6]
        cache = BlockCache()
        publisher = KvEventPublisher(holder.namespace("kve").component("backend"), holder.connection_id)
        await publisher.stored(None, cache.store(None, list(zip(range(1, 7), hashes, strict=True))))
        router = frontend.models.get("kve").router
        assert await until(lambda: router.tree.find_matches(hashes).scores == {holder.connection_id: 6})
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            for _ in range(3):
                assert await served_by(http, "kve", prompt) == holder.connection_id
        # 6 blocks announced, then the whole routed prompt (8 blocks) counts as pending there
        assert router.hit_blocks == 6 + 8 + 8
        await frontend.stop()
    finally:
        for runtime in [*workers, front]:
            await runtime.shutdown()


def test_kv_router_mode_across_processes_needs_nats_or_approximate_mode() -> None:
    from dynamo_nb.flags import frontend_parser
    from dynamo_nb.frontend.config import check_frontend_args

    args = frontend_parser().parse_args(["--discovery", "etcd://127.0.0.1:2379", "--router-mode", "kv"])
    with pytest.raises(ConfigError, match="add --nats-url nats://HOST:PORT, or --no-kv-events"):
        check_frontend_args(args)
    for extra in (["--nats-url", "nats://127.0.0.1:4222"], ["--no-kv-events"]):
        check_frontend_args(frontend_parser().parse_args([*args_list(args), *extra]))
    config = KvRouterConfig.from_args(
        frontend_parser().parse_args(
            ["--router-mode", "kv", "--kv-overlap-score-weight", "2", "--router-temperature", "0.5"]
        )
    )
    assert config == KvRouterConfig(policy=RouterPolicy(prefill_load_scale=2.0, temperature=0.5))


def args_list(args: Any) -> list[str]:
    return ["--discovery", args.discovery, "--router-mode", "kv"]


async def test_kv_routers_of_one_endpoint_share_their_decisions(services: LocalServices) -> None:
    """Replica sync over real NATS: what one router routes counts as load and as a pending prefix
    in the other, so the other sends the same prompt to the same worker; prefill done, free, a
    router's stop and a router gone silent reach the other."""
    make = lambda: DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)  # noqa: E731
    workers = [await make() for _ in range(3)]
    fronts = [await make() for _ in range(3)]

    async def nothing(request: Any, context: Any = None) -> Any:
        yield {}

    try:
        for runtime in workers:
            await runtime.endpoint("rsync.backend.generate").serve(nothing)
        routers = []
        for runtime in fronts:
            client = await runtime.endpoint("rsync.backend.generate").client()
            await client.wait_for_instances(timeout=10)
            assert await until(lambda c=client: len(c.instance_ids()) == 3)
            component = runtime.namespace("rsync").component("backend")
            config = KvRouterConfig(replica_sync=True)
            routers.append(await KvRouter.create(client, 4, config, component=component))
        a, b, c = routers
        assert await until(lambda: all(len(r.sync.peers) == 2 for r in routers), timeout=10)  # heartbeats

        prompt = list(range(300, 332))  # 8 blocks of 4
        route = a.choose(prompt)
        hashes = block_hashes(prompt, 4)
        sequence = sequence_hashes(hashes)
        held = lambda r: r.loads.get(route.instance_id, ActiveLoad())  # noqa: E731
        for other in (b, c):
            assert await until(lambda o=other: route.request_id in held(o).requests)
            assert held(other).prefill_tokens == 32 and held(other).decode_blocks == 8
            assert other.tree.find_matches(hashes).scores == {route.instance_id: 8}  # the pending prefix
        a.first_token(route)  # its prefill is done: the worker holds the prompt and has time
        assert await until(lambda: held(b).requests[route.request_id] == (0, tuple(sequence)))
        again = b.choose(prompt)
        assert again.instance_id == route.instance_id and again.overlap_blocks == 8  # routed as one would
        assert await until(lambda: again.request_id in held(a).requests)
        a.finished(route)
        assert await until(lambda: route.request_id not in held(b).requests)
        assert route.request_id not in held(c).requests

        # a router that stops says so: its requests leave the others' loads
        await b.stop()
        assert await until(lambda: again.request_id not in held(a).requests)
        assert b.sync.router_id not in a.sync.peers

        # a router that goes silent (its process died: no bye) is dropped after `silence`
        dead = c.choose(list(range(500, 532)))
        running_on = lambda r: r.loads.get(dead.instance_id, ActiveLoad()).requests  # noqa: E731
        assert await until(lambda: dead.request_id in running_on(a))
        c.sync._beat.cancel()
        c.sync._unsubscribe()
        a.sync.silence = 0.5
        assert await until(lambda: dead.request_id not in running_on(a), timeout=10)
        assert a.sync.peers == {}
        assert (a.sync.applied, a.sync.sent) == (2, 3)  # b's and c's adds; its add, prefill done, free
        await a.stop()
    finally:
        for runtime in [*fronts, *workers]:
            await runtime.shutdown()


def test_replica_sync_flags() -> None:
    """``--http-workers N`` with NATS shares decisions on its own; ``--router-replica-sync`` needs
    the kv router and an event plane."""
    from dynamo_nb.flags import frontend_parser
    from dynamo_nb.frontend.config import FrontendConfig, check_frontend_args

    etcd = ["--discovery", "etcd://127.0.0.1:2379"]
    nats = ["--nats-url", "nats://127.0.0.1:4222"]
    parse = frontend_parser().parse_args

    def shares(*flags: str) -> bool | None:
        args = parse([*etcd, *flags])
        return FrontendConfig.from_args(args).kv_settings(nats=args.nats_url is not None).replica_sync

    assert shares(*nats, "--router-mode", "kv", "--http-workers", "2")
    assert shares(*nats, "--router-mode", "kv", "--http-reuse-port")
    assert not shares(*nats, "--router-mode", "kv")
    assert not shares("--no-kv-events", "--http-workers", "2")
    assert shares(*nats, "--router-mode", "kv", "--router-replica-sync")
    assert not shares(*nats, "--router-mode", "kv", "--http-workers", "2", "--no-router-replica-sync")
    with pytest.raises(ConfigError, match="add --router-mode kv"):
        check_frontend_args(parse([*etcd, *nats, "--router-replica-sync"]))
    with pytest.raises(ConfigError, match="event plane, NATS: add --nats-url"):
        check_frontend_args(parse([*etcd, "--router-mode", "kv", "--no-kv-events", "--router-replica-sync"]))


def test_stored_events_carry_their_blocks_tokens_only_for_a_sink_that_hashes_them() -> None:
    """NVIDIA Dynamo's KV publisher hashes a block's tokens itself: for it (``event_token_ids``)
    each stored run carries its blocks' token ids; the kit's router gets the hashes alone."""
    from dynamo_nb.engines.kv_cache.blocks import KvBlockManager

    prompt = list(range(100, 112))
    plain = KvBlockManager(num_blocks=8, block_size=4)
    plain.mark_computed(plain.allocate(prompt), 12)
    [event] = plain.drain_events()
    assert "token_ids" not in event["stored"] and len(event["stored"]["blocks"]) == 3
    with_tokens = KvBlockManager(num_blocks=8, block_size=4)
    with_tokens.event_token_ids = True
    first = with_tokens.allocate(prompt[:4])
    with_tokens.mark_computed(first, 4)
    with_tokens.drain_events()
    second = with_tokens.allocate(prompt)  # its first block is cached: the run starts at block 1
    with_tokens.mark_computed(second, 12)
    [event] = with_tokens.drain_events()
    assert event["stored"]["token_ids"] == prompt[4:]
    assert event["stored"]["parent_hash"] == second.sequence[0]


def test_the_zmq_relay_passes_the_blocks_tokens_on_to_a_sink_that_hashes_them() -> None:
    """vLLM's stored events carry their tokens: relayed to NVIDIA Dynamo's publisher they keep them."""
    from dynamo_nb.engines.kv_cache.zmq_relay import ZmqKvRelay

    event = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
             "token_ids": [5, 6, 7, 8], "block_size": 2}  # fmt: skip
    relay = ZmqKvRelay("tcp://127.0.0.1:1", block_size=2)
    assert "token_ids" not in relay.translate(event)["stored"]
    relay.event_token_ids = True
    assert relay.translate(event)["stored"]["token_ids"] == [5, 6, 7, 8]


def test_an_engines_relayed_events_confirm_the_blocks_the_router_counted_pending() -> None:
    """A routed prompt counts on its worker for a few seconds; vLLM's stored event for it (in
    vLLM's own block ids) confirms those very blocks, so they stay after the pending time, and
    vLLM's removal (its ids again) takes them away."""
    from dynamo_nb.engines.kv_cache.zmq_relay import ZmqKvRelay
    from dynamo_nb.router.kv.hashing import block_hashes
    from dynamo_nb.router.kv.indexer import RadixTree

    prompt = list(range(100, 108))
    local = block_hashes(prompt, 2)
    tree = RadixTree(clock=lambda: 0.0)
    tree.insert("w", local, ttl=5.0, now=0.0)  # the router's pending prediction
    relay = ZmqKvRelay("tcp://127.0.0.1:1", block_size=2)
    engine_ids = [b"\x07" * 32, b"\x08" * 32, b"\x09" * 32, b"\x0a" * 32]
    tree.apply_event("w", relay.translate({"type": "BlockStored", "block_hashes": engine_ids[:2],
                                           "parent_block_hash": None, "token_ids": prompt[:4]}))  # fmt: skip
    tree.apply_event("w", relay.translate({"type": "BlockStored", "block_hashes": engine_ids[2:],
                                           "parent_block_hash": engine_ids[1], "token_ids": prompt[4:]}))  # fmt: skip
    assert tree.expire(now=60.0) == 0  # confirmed: nothing left to expire
    assert tree.find_matches(local).scores == {"w": 4}
    tree.apply_event("w", relay.translate({"type": "BlockRemoved", "block_hashes": engine_ids[2:]}))
    assert tree.find_matches(local).scores == {"w": 2}
    assert len(relay.snapshot()) == 2


def test_a_servers_reported_blocks_raise_a_workers_decode_load() -> None:
    """The KV router's decode term takes the blocks a worker's server says are in use when that
    is more than the router routed there (others use the server too), and only then."""
    from dynamo_nb.router.kv.selector import ActiveLoad, cost_parts
    from dynamo_nb.router.server_load import ServerLoad

    own = ActiveLoad()
    own.add("r1", 0, [1, 2, 3])
    options = dict(prompt_tokens=32, block_size=16, overlaps={}, loads={"a": own, "b": own}, sequence=[7, 8])
    reported = {"a": ServerLoad(running=3, kv_usage=0.5, kv_blocks=40).blocks_in_use, "b": 1.0}
    parts = cost_parts(["a", "b"], server_blocks=reported, **options)
    assert parts["a"]["decode_blocks"] == 20 + 2 and parts["a"]["server_blocks"] == 20
    assert parts["b"]["decode_blocks"] == 3 + 2  # the router's own count is more
    assert cost_parts(["a"], **options)["a"]["decode_blocks"] == 3 + 2
    assert ServerLoad.from_stats({"requests": 3}, routed=0, at=0.0) is None  # a kit engine says nothing
    assert ServerLoad.from_stats({"server_running": 5.0, "server_waiting": 1.0}, routed=2, at=0.0).others == 4
