"""The mocker engine: its KV block manager and events, its timing model, and KV routing over
real processes and NATS."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, collect, free_port, req

from dynamo_nb import DisaggregationError, DistributedRuntime, LocalServices, bench
from dynamo_nb.compat.runtime import Context as CompatContext
from dynamo_nb.disagg.decode import DecodeHandler
from dynamo_nb.engines import MockerEngine
from dynamo_nb.engines.kv_cache.blocks import KvBlockManager
from dynamo_nb.engines.mocker import decode_ms, prefill_ms
from dynamo_nb.errors import EngineError, InvalidRequestError, RemoteHandlerError
from dynamo_nb.llm import EmittingStream, PreprocessedRequest, StopConditions, engine_handler
from dynamo_nb.router.kv import RadixTree, block_hashes
from dynamo_nb.runtime import Context, parse_ready_line

MOCKER = ROOT / "components" / "mocker_worker.py"


def test_block_manager_reuses_prefixes_and_evicts_the_least_recently_used() -> None:
    kv = KvBlockManager(num_blocks=6, block_size=4)
    a = kv.allocate(list(range(16)))  # 4 blocks
    assert a.cached_blocks == 0 and kv.active_blocks == 4
    early = kv.allocate(list(range(16)))
    assert early.cached_blocks == 0  # not computed yet: no prefix hit
    kv.release(early)
    assert kv.drain_events() == []  # nor announced
    kv.mark_computed(a, 16)
    b = kv.allocate([*list(range(12)), 99, 98, 97, 96])  # shares 3 blocks, 1 new
    kv.mark_computed(b, 16)
    assert b.cached_blocks == 3 and kv.used_blocks == 5
    events = kv.drain_events()
    assert [list(e) for e in events] == [["stored"], ["stored"]]
    assert events[1]["stored"]["parent_hash"] == a.sequence[2]  # the new block hangs off the shared prefix
    kv.release(a)
    kv.release(b)
    assert kv.active_blocks == 0 and kv.used_blocks == 5  # released blocks stay cached
    assert not KvBlockManager(num_blocks=2, block_size=4).can_allocate(list(range(12)))
    kv.allocate([50 + i for i in range(8)])  # 2 new blocks: one eviction (the oldest free block)
    removed = [e["removed"]["block_hashes"] for e in kv.drain_events() if "removed" in e]
    assert removed == [[a.sequence[3]]]  # a's last block was freed first (the others were still shared)
    kv.allocate([80 + i for i in range(12)])  # 3 new blocks, 3 evictions in a row: one removed event
    removed = [e["removed"]["block_hashes"] for e in kv.drain_events() if "removed" in e]
    # the oldest free blocks in order, each prefix from its tail: b's own block, then the shared ones
    assert removed == [[b.sequence[3], a.sequence[2], a.sequence[1]]]
    assert kv.allocate(list(range(4))).cached_blocks == 1  # the head of the prefix is still there


def test_block_manager_events_and_snapshot_rebuild_the_same_index() -> None:
    kv = KvBlockManager(num_blocks=64, block_size=4)
    for prompt in (list(range(20)), list(range(8)) + [7] * 12, [3] * 9):
        allocation = kv.allocate(prompt)
        kv.mark_computed(allocation, len(prompt))
        kv.release(allocation)
    dropped = kv.allocate([9] * 12)  # cancelled before its prefill: never cached, never announced
    kv.release(dropped)
    assert not kv.allocate([9] * 12).cached_blocks
    from_events, from_snapshot = RadixTree(), RadixTree()
    for event in kv.drain_events():
        from_events.apply_event("w", event)
    for event in kv.snapshot():
        from_snapshot.apply_event("w", event)
    for prompt in (list(range(20)), list(range(8)) + [7] * 12, [3] * 9):
        hashes = block_hashes(prompt, 4)
        assert (
            from_events.find_matches(hashes).scores
            == from_snapshot.find_matches(hashes).scores
            == {"w": len(hashes)}
        )


def test_timing_model_is_dynamos_polynomials() -> None:
    assert prefill_ms(0) == 0.0  # fully cached: no prefill
    assert prefill_ms(1000) == pytest.approx(4.209989e-7 * 1e6 + 1.518344e-2 * 1000 + 16.50142)
    assert decode_ms(0.0) == pytest.approx(5.74) and decode_ms(0.5) == pytest.approx(
        -25.74 / 4 + 54.01 / 2 + 5.74
    )
    assert decode_ms(5.0) == 1.0  # the floor


async def test_the_step_that_finishes_a_prompt_also_decodes_and_load_counts_decoded_tokens() -> None:
    """As Dynamo's mocker: the first token's step costs prefill + decode, and the KV load grows
    with each request's decoded tokens (whole blocks); a prefill worker's pass has no decode."""
    engine = MockerEngine(block_size=4, num_blocks=64, speedup_ratio=1000.0)
    request = PreprocessedRequest(list(range(8)), StopConditions(max_tokens=3))
    assert len([o async for o in engine.generate(request)]) == 3
    # 8 prompt tokens = 2 blocks; after 1 and 2 decoded tokens the request holds 3 blocks
    expected_ms = prefill_ms(8) + decode_ms(2 / 64) + 2 * decode_ms(3 / 64)
    assert engine.steps == 3 and engine.simulated_s == pytest.approx(expected_ms / 1000 / 1000)
    await engine.close()

    slower_decode = MockerEngine(block_size=4, num_blocks=64, speedup_ratio=1000.0, decode_speedup_ratio=0.5)
    assert len([o async for o in slower_decode.generate(request)]) == 3
    expected_ms = prefill_ms(8) + 2 * (decode_ms(2 / 64) + 2 * decode_ms(3 / 64))
    assert slower_decode.simulated_s == pytest.approx(expected_ms / 1000 / 1000)
    await slower_decode.close()

    prefill = MockerEngine(block_size=4, num_blocks=64, speedup_ratio=1000.0)
    header, _ = await prefill._prefill_handoff(
        PreprocessedRequest(list(range(8)), StopConditions(max_tokens=3)), None
    )
    assert header["first_token"] == 0 and prefill.simulated_s == pytest.approx(prefill_ms(8) / 1000 / 1000)
    await prefill.close()


async def test_the_mocker_streams_no_special_tokens_when_told_them(tiny_path: Any) -> None:
    """The worker passes its tokenizer's special ids: a chat prompt's markers (which decode to no
    text, so a client would see its first text a few steps late) are not streamed."""
    from dynamo_nb.llm import ModelTokenizer

    tokenizer = ModelTokenizer.load(tiny_path)
    special = tokenizer.special_token_ids()
    prompt = tokenizer.encode(
        tokenizer.render_chat([{"role": "user", "content": "hi"}]), add_special_tokens=False
    )
    assert special and set(prompt) & special  # the template's markers are special tokens
    engine = MockerEngine(speedup_ratio=1000.0, skip_token_ids=special)
    outputs = [o async for o in engine.generate(PreprocessedRequest(prompt, StopConditions(max_tokens=6)))]
    await engine.close()
    streamed = [t for o in outputs for t in o.token_ids]
    assert len(streamed) == 6 and not set(streamed) & special
    assert tokenizer.decode(streamed[:1])  # the first token already has text


@pytest.mark.parametrize("step_ms", [0.05, 5.0])
async def test_steps_sleep_until_their_deadline_not_a_timer_tick_each(step_ms: float) -> None:
    """1000 steps of 0.05 ms (far below the event loop's ~1 ms timer resolution) or of 5 ms: the
    run never ends before its simulated time, and it does not lose a tick per step (that would
    be a second more). Half a second is the bound, so a busy host does not fail it; the best of
    three runs counts (a busy host can steal a run's CPU)."""
    loop = asyncio.get_running_loop()
    excess = []
    for _ in range(3):
        engine = MockerEngine(block_size=4, num_blocks=1 << 20, speedup_ratio=decode_ms(0.0) / step_ms)
        request = PreprocessedRequest(list(range(4)), StopConditions(max_tokens=1001))
        started = loop.time()
        assert len([o async for o in engine.generate(request)]) == 1001
        measured = loop.time() - started
        await engine.close()
        assert engine.steps == 1001
        assert measured >= engine.simulated_s * 0.99, (measured, engine.simulated_s)  # sleeps, never early
        excess.append(measured - engine.simulated_s)
        if excess[-1] < 0.5:
            break
    assert min(excess) < 0.5, f"the run took {[f'{e:.2f}' for e in excess]} s more than its simulated time"


async def test_engine_streams_exactly_max_tokens_and_reuses_the_cache() -> None:
    published: list[Any] = []

    async def publish(event: Any) -> None:
        published.append(event)

    engine = MockerEngine(block_size=4, speedup_ratio=100.0, kv_events=publish)
    request = {"token_ids": list(range(1, 33)), "stop_conditions": {"max_tokens": 7}}
    first = await collect(engine.generate(req(request)))
    assert [len(i["token_ids"]) for i in first] == [1] * 7 and first[-1]["finish_reason"] == "length"
    assert first[-1]["completion_usage"] == {
        "prompt_tokens": 32, "completion_tokens": 7, "total_tokens": 39, "prompt_tokens_details": {"cached_tokens": 0}
    }  # fmt: skip
    both = await asyncio.gather(
        collect(engine.generate(req(request))),
        collect(engine.generate(req({**request, "token_ids": [5] * 32}))),
    )
    assert [len(items) for items in both] == [7, 7]
    assert engine.prefix_hits == 8 and engine.prompt_blocks == 24  # the repeat found its 8 blocks cached
    cached = [items[-1]["completion_usage"]["prompt_tokens_details"]["cached_tokens"] for items in both]
    assert cached == [32, 0]  # and says so: 8 blocks of 4
    assert [next(iter(e)) for e in published] == ["stored", "stored"] and engine.active == 0
    await engine.close()


@pytest.mark.parametrize("mode", ["memory-tcp", "memory-inproc"])
async def test_a_served_mocker_sends_each_token_from_its_step_the_items_iterating_gives(
    make_runtime: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served with `engine_handler(..., emit=True)` (as `serve_llm` serves), the mocker's step
    sends each token through the server's ``context.emit`` (its stream is an `EmittingStream`):
    the caller gets exactly the items that iterating the engine gives, ends and refusals
    included. A handler served without ``emit`` (e.g. inside a wrapper) iterates."""
    request = {"token_ids": list(range(1, 41)), "stop_conditions": {"max_tokens": 6}}
    expected = await collect(MockerEngine(block_size=4, speedup_ratio=1000.0).generate(req(request)))
    assert [len(i["token_ids"]) for i in expected] == [1] * 6 and expected[-1]["finish_reason"] == "length"

    engine = MockerEngine(block_size=4, num_blocks=16, speedup_ratio=1000.0)
    assert isinstance(engine.generate(req(request)), EmittingStream)

    def not_iterated(*args: Any) -> Any:
        raise AssertionError("a served mocker's stream was iterated, not emitted")

    monkeypatch.setattr(engine, "_stream", not_iterated)
    server_rt, client_rt = await make_runtime(mode), await make_runtime(mode)
    await server_rt.endpoint("test.emit.generate").serve(engine_handler(engine.generate, emit=True))
    client = await client_rt.endpoint("test.emit.generate").client()
    await client.wait_for_instances(timeout=10)
    assert await collect(client.round_robin(request)) == expected
    monkeypatch.undo()

    seen_by_wrapper: list[Any] = []

    async def counting(request: Any, context: Context) -> Any:  # a user's wrapper reads the items
        async for item in engine_handler(engine.generate)(request, context):
            seen_by_wrapper.append(item)
            yield item

    await server_rt.endpoint("test.wrapped.generate").serve(counting)
    wrapped = await client_rt.endpoint("test.wrapped.generate").client()
    await wrapped.wait_for_instances(timeout=10)
    assert await collect(wrapped.round_robin(request)) == seen_by_wrapper
    assert [i["token_ids"] for i in seen_by_wrapper] == [i["token_ids"] for i in expected]
    monkeypatch.setattr(engine, "_stream", not_iterated)
    again = await collect(client.round_robin(request))  # the same again, its prompt now cached
    assert again[:-1] == expected[:-1]
    assert again[-1]["completion_usage"]["prompt_tokens_details"] == {"cached_tokens": 40}

    monkeypatch.undo()  # a compat (Dynamo-style) context wraps ours: the stream is iterated
    iterated = await collect(engine_handler(engine.generate)(request, CompatContext("c-1")))
    assert iterated == [*expected[:-1], again[-1]]
    with pytest.raises(RemoteHandlerError, match=r"InvalidRequestError.*num-gpu-blocks"):  # 20 of 16 blocks
        await collect(client.round_robin({**request, "token_ids": list(range(80))}))

    slow = {"token_ids": [7] * 8, "stop_conditions": {"max_tokens": 100_000}}
    context = Context()
    seen: list[Any] = []
    async for item in client.round_robin(slow, context=context):
        seen.append(item)
        if len(seen) == 3:
            context.stop_generating()
    assert seen[-1]["finish_reason"] == "cancelled" and len(seen) < 100
    assert seen[-1]["completion_usage"]["completion_tokens"] == len(seen) - 1
    for _ in range(100):
        if engine.active == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.active == 0
    await engine.close()


async def test_an_emitted_stream_whose_items_cannot_be_sent_fails_alone() -> None:
    """An ``emit`` that raises (its plane cannot encode the item) ends that stream with the
    error; the engine's step goes on for the others."""
    engine = MockerEngine(block_size=4, speedup_ratio=1000.0)
    request = req({"token_ids": list(range(1, 9)), "stop_conditions": {"max_tokens": 4}})

    def refuse(item: Any) -> None:
        raise TypeError("cannot encode")

    sent: list[Any] = []
    results = await asyncio.gather(
        engine.generate(request).emit_to(refuse), engine.generate(request).emit_to(sent.append),
        return_exceptions=True,
    )  # fmt: skip
    assert isinstance(results[0], TypeError) and results[1] is None
    assert len(sent) == 4 and sent[-1]["finish_reason"] == "length" and engine.active == 0

    def too_large(item: Any) -> None:  # any error, not only an encoder's
        raise OverflowError("frame too large")

    sent.clear()
    results = await asyncio.wait_for(asyncio.gather(
        engine.generate(request).emit_to(too_large), engine.generate(request).emit_to(sent.append),
        return_exceptions=True,
    ), timeout=10)  # fmt: skip
    assert isinstance(results[0], OverflowError) and results[1] is None and len(sent) == 4
    await engine.close()


async def test_closing_the_mocker_ends_the_streams_still_running_with_an_error() -> None:
    """`close` while streams run (emitted and iterated, one still waiting for a slot): each ends
    with an `EngineError` that says the engine closed, none waits forever."""
    engine = MockerEngine(block_size=4, speedup_ratio=1.0, max_num_seqs=2)  # a token every ~6 ms
    long = req({"token_ids": list(range(1, 9)), "stop_conditions": {"max_tokens": 100_000}})
    sent: list[Any] = []
    emitted = asyncio.ensure_future(engine.generate(long).emit_to(sent.append))
    iterated_items: list[Any] = []

    async def iterate() -> None:
        async for item in engine.generate(long):
            iterated_items.append(item)

    iterated = asyncio.ensure_future(iterate())
    waiting = asyncio.ensure_future(collect(engine.generate(long)))  # no slot: max_num_seqs=2
    for _ in range(1000):  # both streams under way (10 s at most)
        if len(sent) >= 3 and len(iterated_items) >= 3:
            break
        await asyncio.sleep(0.01)
    assert len(sent) >= 3 and len(iterated_items) >= 3
    await engine.close()
    results = await asyncio.wait_for(asyncio.gather(emitted, iterated, waiting, return_exceptions=True), 5)
    assert all(isinstance(r, EngineError) and "closed" in str(r) for r in results), results
    assert engine.active == 0


async def test_kv_routing_over_processes_and_nats_sends_a_repeated_prefix_back(
    services: LocalServices, start_worker: Any, tmp_path: Path
) -> None:
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    mocker = await start_worker(*bus, "--num-workers", "2", "--speedup-ratio", "20", "--kv-cache-block-size", "4",
                                script=MOCKER)  # fmt: skip
    workers = parse_ready_line(mocker.ready_line)[1]["instance"].split(",")
    assert len(workers) == 2
    port = free_port()
    await start_worker(*bus, "--http-port", str(port), "--router-mode", "kv", script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", instances=2, timeout=30)

    async def served_by(http: httpx.AsyncClient, prompt: list[int]) -> str:
        body = {
            "model": "tiny-llama",
            "prompt": prompt,
            "max_tokens": 3,
            "nvext": {"extra_fields": ["worker_id"]},
        }
        reply = (await http.post("/v1/completions", json=body)).json()
        assert reply["usage"]["completion_tokens"] == 3
        return f"{reply['nvext']['worker_id']['decode_worker_id']:x}"

    shared = list(range(10, 74))  # 16 blocks
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        holder = await served_by(http, [*shared, 1, 2, 3, 4])
        await asyncio.sleep(0.3)  # its stored event crosses NATS to the frontend's indexer
        assert [await served_by(http, [*shared, 9, 9, 9, i]) for i in range(3)] == [holder] * 3
        other = await served_by(http, list(range(300, 364)))  # nothing cached anywhere: the emptier worker
        assert {holder, other} == set(workers)
    mocker.send_signal(signal.SIGTERM)  # every engine's runtime shuts down, not only the last one's
    assert await mocker.wait(timeout=15) == 0


async def test_engine_chunks_long_prompts_and_refuses_what_never_fits() -> None:
    engine = MockerEngine(block_size=4, max_num_batched_tokens=16, speedup_ratio=1000.0)
    items = await collect(
        engine.generate(req({"token_ids": list(range(40)), "stop_conditions": {"max_tokens": 2}}))
    )
    assert len(items) == 2
    assert engine.steps == 4  # 40 prompt tokens in chunks of 16, 16 and 8 (the first token), then one more
    small = MockerEngine(block_size=4, num_blocks=4, speedup_ratio=1000.0)
    with pytest.raises(InvalidRequestError, match="num-gpu-blocks"):
        await collect(
            small.generate(req({"token_ids": list(range(40)), "stop_conditions": {"max_tokens": 2}}))
        )
    assert small.active == 0
    await engine.close()
    await small.close()


async def test_prefill_and_decode_roles_hand_off_and_give_the_aggregated_tokens() -> None:
    """A mocker prefill parks a tensor-less handoff; a mocker decode fetches it, holds the whole
    prompt's blocks as computed (and says so in KV events) and streams the rest of max_tokens —
    the same tokens as the aggregated engine; through DecodeHandler it asks a prefill itself."""
    decode_events: list[Any] = []

    async def publish(event: Any) -> None:
        decode_events.append(event)

    aggregated = MockerEngine(block_size=4, speedup_ratio=100.0)
    prefill = MockerEngine(block_size=4, speedup_ratio=100.0)
    decode = MockerEngine(block_size=4, speedup_ratio=100.0, kv_events=publish)
    await prefill.start_bootstrap()
    request = {"token_ids": list(range(1, 23)), "stop_conditions": {"max_tokens": 5}}
    expected = [t for item in await collect(aggregated.generate(req(request))) for t in item["token_ids"]]
    room = 1234
    fast = {
        **request,
        "bootstrap_info": {**prefill.bootstrap.endpoint, "bootstrap_room": room, "bootstrap_token": "t"},
    }
    decoded, prefilled = await asyncio.gather(
        collect(decode.decode(req(fast))), collect(prefill.prefill(req(fast)))
    )
    assert prefilled[0]["disaggregated_params"]["bootstrap_room"] == room
    assert prefilled[-1]["token_ids"] == expected[:1] and prefilled[-1]["finish_reason"] == "length"
    assert [t for item in decoded for t in item["token_ids"]] == expected
    assert decoded[-1]["completion_usage"]["completion_tokens"] == 5
    assert prefill.stats()["prompt_blocks"] == 5 and prefill.stats()["cached_blocks"] == 5
    assert decode.stats()["steps"] == 4  # tokens 2..5: no prefill step
    assert [list(e) for e in decode_events] == [["stored"]] and len(decode_events[0]["stored"]["blocks"]) == 5

    runtime = await DistributedRuntime.create()
    try:
        await runtime.endpoint("md.prefill.generate").serve(engine_handler(prefill.prefill))
        handler = DecodeHandler(decode, await runtime.endpoint("md.prefill.generate").client())
        items = await collect(handler.generate(req(request)))  # no bootstrap info: it asks a prefill itself
        assert [t for item in items for t in item["token_ids"]] == expected and handler.self_prefills == 1
        assert prefill.stats()["prefix_hits"] == 5  # the prompt was cached on the prefill engine
    finally:
        await runtime.shutdown()
    refused = {**request, "bootstrap_info": {**prefill.bootstrap.endpoint, "bootstrap_room": 99}}
    prefill.bootstrap.park(99, {"format": "dynamo_nb.kv.v1", "prompt_tokens": 22, "payload_bytes": 0}, b"")
    with pytest.raises(DisaggregationError, match="a mocker decode needs a mocker prefill"):
        await collect(decode.decode(req(refused)))
    for engine in (aggregated, prefill, decode):
        await engine.close()


async def test_disaggregated_mocker_processes_behind_a_kv_routing_frontend(
    services: LocalServices, start_worker: Any
) -> None:
    """Prefill and decode mocker processes over etcd + NATS: the frontend's prefill planner asks
    its KV router, so a repeated prefix goes back to the prefill engine that cached it."""
    bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--kv-cache-block-size", "4",
           "--speedup-ratio", "20", "--endpoint", "mdg.backend.generate", "--prefill-endpoint", "mdg.prefill.generate"]  # fmt: skip
    prefill = await start_worker(*bus, "--mode", "prefill", "--num-workers", "2", script=MOCKER)
    assert prefill.ready_line.startswith("READY mdg.prefill.generate")
    prefill_ids = set(parse_ready_line(prefill.ready_line)[1]["instance"].split(","))
    await start_worker(*bus, "--mode", "decode", script=MOCKER)
    port = free_port()
    await start_worker(*bus[:4], "--http-port", str(port), "--router-mode", "kv", script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)

    async def send(http: httpx.AsyncClient, prompt: list[int]) -> str:
        response = await http.post(
            "/v1/completions", json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 4}
        )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        assert response.headers["x-dynamo-path"] == "fast"
        return response.headers["x-dynamo-prefill-worker"]

    shared = list(range(10, 74))  # 16 blocks
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        seen = set()
        for i in range(20):  # fresh prompts: the emptier prefill engine, until both are known
            seen.add(await send(http, list(range(100 + 40 * i, 140 + 40 * i))))
            if len(seen) == 2:
                break
        assert seen == prefill_ids
        holder = await send(http, [*shared, 1])
        await asyncio.sleep(0.3)  # its stored event crosses NATS
        assert [await send(http, [*shared, 5 + i]) for i in range(3)] == [holder] * 3
        assert holder in prefill_ids
