"""The hf engine's batched decoding against one forward pass per request, in one run.

The built-in tiny model in this process, one engine run two ways: batching every decoding
sequence into one forward pass per step (the default), and stepping each sequence on its own
(the baseline, ``batch_decode=False``). One engine, so one model thread: a second engine's
thread (and its OpenMP team) would compete for the two cores and slow both. Each runs greedy requests of 64 tokens (eos ignored) at
concurrency 1 and 8, the same prompts, the engines alternating (best of two each); reported:
output tokens/s, the ratio batched / one-by-one at each level, and how throughput grows from
concurrency 1 to 8.

    python benchmarks/hf_batching.py [--requests 64] [--out benchmarks/results/hf_batching.json]
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb.engines import HFEngine
from dynamo_nb.llm import ModelTokenizer, PreprocessedRequest, SamplingOptions, StopConditions
from dynamo_nb.models import tiny_model_path

TOKENS = 64
LEVELS = (1, 8)
QUESTIONS = [f"Question {i}: what does the number {i * 7} mean in a story about {i} cats?" for i in range(64)]


async def throughput(engine: HFEngine, prompts: list[list[int]], level: int, requests: int) -> float:
    """Output tokens/s with ``level`` requests in flight at a time."""
    remaining = iter(range(requests))

    async def client() -> int:
        produced = 0
        for index in remaining:
            request = PreprocessedRequest(
                prompts[index % len(prompts)],
                StopConditions(max_tokens=TOKENS, ignore_eos=True),
                SamplingOptions(temperature=0),
            )
            produced += sum([len(output.token_ids) async for output in engine.generate(request)])
        return produced

    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(client() for _ in range(level))))
    return tokens / (time.perf_counter() - started)


async def main(requests: int) -> dict[str, Any]:
    tokenizer = ModelTokenizer.load(tiny_model_path())
    prompts = [
        tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": q}]), add_special_tokens=False)
        for q in QUESTIONS
    ]
    engine = await HFEngine.load(tiny_model_path(), device="cpu", prefix_cache_blocks=0)
    rows = []
    try:
        for batch_decode in (True, False):  # warm-up
            engine.scheduler.batch_decode = batch_decode
            await throughput(engine, prompts, 2, 4)
        for level in LEVELS:
            count = max(requests if level > 1 else requests // 4, level)
            best = {"batched": 0.0, "one_by_one": 0.0}
            for name in ["batched", "one_by_one"] * 2:  # ABAB, best of two
                engine.scheduler.batch_decode = name == "batched"
                best[name] = max(best[name], await throughput(engine, prompts, level, count))
            rows.append(
                {
                    "concurrency": level,
                    "requests": count,
                    "batched_tok_per_s": best["batched"],
                    "one_by_one_tok_per_s": best["one_by_one"],
                    "ratio_batched_to_one_by_one": best["batched"] / best["one_by_one"],
                }
            )
    finally:
        await engine.close()
    by_level = {row["concurrency"]: row for row in rows}
    return {
        "rows": rows,
        "batched_c8_over_c1": by_level[8]["batched_tok_per_s"] / by_level[1]["batched_tok_per_s"],
        "one_by_one_c8_over_c1": by_level[8]["one_by_one_tok_per_s"] / by_level[1]["one_by_one_tok_per_s"],
        "setup": {
            "machine": machine(),
            "model": "the built-in tiny model (float32, CPU)",
            "tokens_per_request": TOKENS,
        },
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"\nhf engine, greedy {TOKENS}-token requests (output tokens/s)")
    print(f"{'concurrency':>11}{'batched':>10}{'one by one':>12}{'ratio':>8}")
    for row in report["rows"]:
        print(
            f"{row['concurrency']:>11}{row['batched_tok_per_s']:>10.0f}{row['one_by_one_tok_per_s']:>12.0f}"
            f"{row['ratio_batched_to_one_by_one']:>8.2f}"
        )
    print(
        f"concurrency 8 over 1: batched {report['batched_c8_over_c1']:.2f}x, "
        f"one by one {report['one_by_one_c8_over_c1']:.2f}x"
    )


if __name__ == "__main__":
    run_benchmark(
        __doc__, "hf_batching", main, print_table, requests=32, requests_help="requests at concurrency 8"
    )
