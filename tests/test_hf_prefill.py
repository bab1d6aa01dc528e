"""The hf engine's batched and chunked prefill: a step's token budget, prompts prefilled together
in one forward pass or in chunks over several steps, and greedy tokens that do not depend on how
a prompt was prefilled or what ran beside it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from helpers import collect, req, until

from dynamo_nb import ConfigError
from dynamo_nb.engines import HFEngine
from dynamo_nb.engines.hf_prefill import plan_prefill


def greedy(ids: list[int], max_tokens: int) -> Any:
    return req(
        {
            "token_ids": ids,
            "stop_conditions": {"max_tokens": max_tokens, "ignore_eos": True},
            "sampling_options": {"temperature": 0},
        }
    )


def tokens_of(items: list[dict[str, Any]]) -> list[int]:
    return [token for item in items for token in item["token_ids"]]


async def arrive_and_run(engine: HFEngine, ids: list[int], max_tokens: int, at_step: int) -> list[int]:
    """Send the request once the engine has run ``at_step`` steps (or runs nothing): it arrives
    while others prefill or decode. Its greedy tokens."""
    await until(lambda: engine.scheduler.steps_total >= at_step or not engine.active, timeout=60)
    return tokens_of(await collect(engine.generate(greedy(ids, max_tokens))))


def prompts_drawn(rng: random.Random, count: int, vocab: int) -> list[list[int]]:
    """Prompts of lengths from 1 to 70 tokens (longer than some budgets below, shorter than others)."""
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 70))] for _ in range(count)]


@pytest.mark.parametrize(
    ("needs", "budget", "decodes", "chunked", "planned"),
    [
        ([100, 100, 100], 256, 6, True, [100, 100, 50]),  # decodes first, the last prompt chunked
        ([100, 100, 100], 256, 6, False, [100, 100]),  # the third waits for a step with room
        ([30, 5], 256, 0, True, [30, 5]),
        ([300, 5], 64, 0, True, [64]),  # a long prompt takes the budget; the short one waits behind it
        ([100], 64, 80, True, [64]),  # decodes used the budget up: the first prompt still progresses
        ([100], 1, 0, False, [100]),  # unchunked, a prompt over the budget runs whole (alone)
        ([], 64, 0, True, []),
    ],
)
def test_a_steps_budget_goes_to_decodes_then_to_prompts_in_order(
    needs: list[int], budget: int, decodes: int, chunked: bool, planned: list[int]
) -> None:
    assert plan_prefill(needs, budget, decodes=decodes, chunked=chunked) == planned


async def test_the_budget_flags_are_checked(tiny_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens must be at least 1"):
        await HFEngine.load(tiny_path, max_num_batched_tokens=0)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
async def test_greedy_tokens_do_not_depend_on_batching_chunking_or_the_prefix_cache(
    tiny_path: Path, device: str
) -> None:
    """On each device (float32: on CUDA, bfloat16 matrix products of different shapes round
    differently), for every batch composition drawn (prompt lengths, output lengths, arrival order, budgets
    from smaller than a prompt to larger than all of them, prefix cache on and off, prompts sharing
    a prefix), each request's greedy tokens equal what it gets alone, prefilled whole, with nothing
    beside it; and the prefills were batched and chunked as planned."""
    rng = random.Random(20261127)
    reference = await HFEngine.load(tiny_path, device=device, dtype="float32", prefix_cache_blocks=0)
    vocab = reference.model.config.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(40)]  # a system prompt two requests share
    try:
        for budget, prefix_cache_blocks in ((5, 0), (23, 256), (64, 0), (2048, 256)):
            engine = await HFEngine.load(
                tiny_path, device=device, dtype="float32", max_num_batched_tokens=budget,
                prefix_cache_blocks=prefix_cache_blocks,
            )  # fmt: skip
            try:
                prompts = [*prompts_drawn(rng, 6, vocab), [*shared, 7, 8], [*shared, 9]]
                if prefix_cache_blocks:  # the system prompt is cached before the burst
                    await collect(engine.generate(greedy([*shared, 5], 1)))
                lengths = [rng.randint(1, 12) for _ in prompts]
                alone = [
                    tokens_of(await collect(reference.generate(greedy(ids, n))))
                    for ids, n in zip(prompts, lengths, strict=True)
                ]
                order = list(range(len(prompts)))
                rng.shuffle(order)

                start = engine.scheduler.steps_total
                together = await asyncio.gather(
                    *(
                        arrive_and_run(
                            engine, prompts[index], lengths[index], start + rng.choice((0, 0, 1, 2, 4, 7))
                        )
                        for index in order
                    )
                )
                assert dict(zip(order, together, strict=True)) == dict(enumerate(alone)), (
                    budget,
                    prefix_cache_blocks,
                )
                stats = engine.stats()
                assert stats["prefill_chunks"] >= len(prompts)
                if budget < 70:  # a prompt over the budget was prefilled in more than one chunk
                    longest = max(len(ids) for ids in prompts)
                    assert stats["prefill_chunks"] >= len(prompts) + (longest - 1) // budget, stats
                if prefix_cache_blocks:  # the prompts with the system prompt reused its blocks
                    assert stats["prefix_hits"] >= 2 * (len(shared) // 16), stats
                    assert engine.prefix_cache is not None
                    assert engine.prefix_cache.blocks.active_blocks == 0  # every prefill let its blocks go
            finally:
                await engine.close()
    finally:
        await reference.close()


@pytest.mark.parametrize("device", DEVICES)
async def test_a_burst_of_prompts_prefills_in_one_forward_pass(tiny_path: Path, device: str) -> None:
    engine = await HFEngine.load(tiny_path, device=device, prefix_cache_blocks=0)
    try:
        prompts = [[5 + i] * (3 + i) for i in range(8)]
        results = await asyncio.gather(*(collect(engine.generate(greedy(ids, 2))) for ids in prompts))
        assert all(len(tokens_of(items)) == 2 for items in results)
        stats = engine.stats()
        assert stats["prefill_chunks"] == 8
        assert stats["prefill_passes"] < 8, stats  # arrivals of one burst share passes
    finally:
        await engine.close()


async def test_on_a_cpu_only_short_fresh_chunks_share_a_pass(tiny_path: Path) -> None:
    """A CPU computes every padded position: short chunks without a past share a pass, a long one
    or one with a past (a prefix hit, an earlier chunk) runs alone; a GPU runs them all in one.
    Either way each row's logits are those it gets alone."""
    import torch

    from dynamo_nb.engines.hf_prefill import CPU_PASS_TOKENS, PrefillRow, prefill_passes, prefill_rows
    from dynamo_nb.engines.model_calls import new_kv_cache

    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=0)
    model = engine.model
    try:
        with torch.inference_mode():

            def fresh_rows() -> list[PrefillRow]:  # a lone pass extends its row's cache: new ones each time
                _, (past,) = prefill_rows(model, [PrefillRow(new_kv_cache(model), list(range(10, 50)))])
                chunks = [[5] * 8, [6] * 12, list(range(3, 303)), [7] * 9, [8] * 4, [9] * 30]
                rows = [PrefillRow(new_kv_cache(model), ids) for ids in chunks]
                return [*rows[:4], PrefillRow(past, [11, 12, 13]), *rows[4:]]

            rows = fresh_rows()
            assert prefill_passes(rows, "cpu") == [[0, 1], [2], [3], [4], [5, 6]]
            assert prefill_passes(rows, "cuda") == [list(range(7))]
            assert all(len(p) * max(len(rows[i].tokens) for i in p) <= CPU_PASS_TOKENS
                       for p in prefill_passes(rows, "cpu") if len(p) > 1)  # fmt: skip
            logits, _ = prefill_rows(model, rows)
            for row, alone in enumerate(fresh_rows()):
                expected = prefill_rows(model, [alone])[0][0]
                torch.testing.assert_close(logits[row], expected, rtol=1e-4, atol=1e-4)
    finally:
        await engine.close()


async def test_running_requests_get_a_token_every_step_while_a_long_prompt_is_chunked(
    tiny_path: Path,
) -> None:
    """With a budget of 8 tokens, a 64-token prompt takes about nine steps to prefill; a request
    already decoding gets a token in each of them instead of waiting for the whole prompt."""
    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=0, max_num_batched_tokens=8)
    try:
        running = engine.generate(greedy([5, 6, 7], 60))
        first = await anext(running)
        long_started = asyncio.Event()
        long_first_token = asyncio.Event()
        tokens_meanwhile = 0

        async def long_prompt() -> list[int]:
            stream = engine.generate(greedy(list(range(3, 67)), 2))
            long_started.set()
            items = []
            async for item in stream:
                long_first_token.set()
                items.append(item)
            return items

        task = asyncio.create_task(long_prompt())
        await long_started.wait()
        async for item in running:
            if long_first_token.is_set():
                break
            tokens_meanwhile += len(item.token_ids)
        await running.aclose()
        assert len(tokens_of([item.to_dict() for item in await task])) == 2
        assert first.token_ids
        assert tokens_meanwhile >= 5, tokens_meanwhile  # one per chunk step (vs one step unchunked)
    finally:
        await engine.close()


async def test_a_request_cancelled_mid_prefill_lets_its_prefix_blocks_go(tiny_path: Path) -> None:
    engine = await HFEngine.load(tiny_path, max_num_batched_tokens=4)
    try:
        prompt = list(range(3, 83))  # 80 tokens: 20 steps of 4
        stream = engine.generate(greedy(prompt, 4))
        task = asyncio.create_task(anext(stream))
        await until(lambda: engine.scheduler.prefill_passes >= 3, timeout=60)  # mid-prefill
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stream.aclose()
        assert engine.active == 0
        tokens_of(await collect(engine.generate(greedy([5, 6], 1))))  # the next step lets them go
        assert engine.prefix_cache is not None and engine.prefix_cache.blocks.active_blocks == 0
    finally:
        await engine.close()


async def test_the_decode_batch_copies_in_only_the_sequences_that_join(tiny_path: Path) -> None:
    """Members leave and join (shorter and longer than the batch, which then grows on the left or
    drops the columns nobody uses); every member's logits stay those it gets alone, and a change
    copies in the joining rows only."""
    import torch

    from dynamo_nb.engines.hf_batch import DecodeBatch
    from dynamo_nb.engines.hf_prefill import PrefillRow, prefill_rows
    from dynamo_nb.engines.model_calls import forward_with_cache, new_kv_cache

    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=0)
    model = engine.model
    try:
        with torch.inference_mode():
            prompts = {1: [5, 6, 7, 8, 9], 2: [10, 11], 3: list(range(20, 40)), 4: [12]}
            own, alone = ({key: prefill_rows(model, [PrefillRow(new_kv_cache(model), ids)])[1][0]
                           for key, ids in prompts.items()} for _ in range(2))  # fmt: skip

            def expected(key: int, token: int) -> Any:
                return forward_with_cache(model, alone[key], input_ids=torch.tensor([[token]])).logits[0, -1]

            batch = DecodeBatch(model)
            # (who stays, who joins): 3 is longer than the batch, 4 shorter; 3 leaving frees columns
            plan = [(set(), [1, 2]), ({1, 2}, [3]), ({2, 3}, [4]), ({4}, []), ({4}, [1])]
            members: set[int] = set()
            for step, (keep, joining) in enumerate(plan):
                before = batch.joined_rows
                own.update({key: batch.cache_of(key) for key in members - keep})  # leaving: its KV so far
                batch.update(keep & members, [(key, own[key]) for key in joining])
                members = (keep & members) | set(joining)
                assert set(batch.ids) == members and batch.joined_rows - before == len(joining)
                tokens = {key: 3 + step + key for key in batch.ids}
                logits = batch.step([tokens[key] for key in batch.ids])
                for row, key in enumerate(batch.ids):
                    torch.testing.assert_close(logits[row], expected(key, tokens[key]), rtol=1e-4, atol=1e-4)
                for key in batch.ids:  # a member's own cache equals running it alone
                    assert batch.cache_of(key).get_seq_length() == alone[key].get_seq_length()
    finally:
        await engine.close()


async def test_sequences_coming_and_going_keep_their_logits_and_rarely_move_the_batch(
    tiny_path: Path,
) -> None:
    """Seventy steps, each letting one member go (any row: the last takes its place) and one join
    (shorter or longer than the others, so the window widens and the buffers run out of columns
    and rows): every member's logits stay those it gets alone, and the buffers are replaced only
    a few times (each time with twice the room), not at every change."""
    import torch

    from dynamo_nb.engines.hf_batch import DecodeBatch
    from dynamo_nb.engines.hf_prefill import PrefillRow, prefill_rows
    from dynamo_nb.engines.model_calls import forward_with_cache, new_kv_cache

    engine = await HFEngine.load(tiny_path, prefix_cache_blocks=0)
    model, draw = engine.model, random.Random(3)
    try:
        with torch.inference_mode():

            def prefilled(length: int) -> tuple[Any, Any]:
                ids = [draw.randrange(10, 1000) for _ in range(length)]
                return tuple(
                    prefill_rows(model, [PrefillRow(new_kv_cache(model), ids)])[1][0] for _ in range(2)
                )

            batch, alone, next_id = DecodeBatch(model), {}, 0
            for step in range(70):
                leaving = {draw.choice(batch.ids)} if len(batch.ids) > 6 else set()
                joining = []
                for _ in range(4 if step == 0 else 2 if step % 4 == 0 else 1):
                    own, alone[next_id] = prefilled(draw.choice((3, 9, 30, 60)))
                    joining.append((next_id, own))
                    next_id += 1
                batch.update(set(batch.ids) - leaving, joining)
                tokens = [draw.randrange(10, 1000) for _ in batch.ids]
                logits = batch.step(tokens)
                for row, (seq_id, token) in enumerate(zip(batch.ids, tokens, strict=True)):
                    own_logits = forward_with_cache(model, alone[seq_id], input_ids=torch.tensor([[token]]))
                    torch.testing.assert_close(logits[row], own_logits.logits[0, -1], rtol=1e-4, atol=1e-4)
            assert batch.joined_rows == 4 + 69 + 17
            assert 2 <= batch.reallocations <= 8, batch.reallocations  # more rows, more columns: a few times
            member = batch.ids[0]
            assert batch.cache_of(member).get_seq_length() == alone[member].get_seq_length()
    finally:
        await engine.close()
