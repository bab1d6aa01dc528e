"""What a grammar costs: the hf engine (the built-in tiny model, behind the frontend, in this
process) answering the same prompts with and without a JSON-schema grammar, in one run.

Each request asks for up to 128 tokens (greedy). Without a grammar the tokens are free text (all
128: eos ignored); with one they must be the schema's JSON (an array of exactly 30 digits, about
60 tokens), each step's logits row masked by llguidance (`dynamo_nb.engines.hf_grammar`). At
concurrency 1 and 8: output tokens/s, TTFT and ITL p50, and the ratio with / without. Beside
them, the grammar's compile time per schema (the frontend compiles each request's once): 50
generated schemas, the median and p90 of ``GuidedDecoding.check`` and of making a matcher.

    python benchmarks/structured_output.py [--requests 96]
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _harness import level_figures, machine, run_benchmark

from dynamo_nb import DistributedRuntime, bench
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.hf import HFEngine
from dynamo_nb.engines.hf_grammar import Grammars
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm.guided import GuidedDecoding
from dynamo_nb.models import tiny_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import random_schema

MODEL, TOKENS, LEVELS = "tiny-llama", 128, (1, 8)
SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 9},
    "minItems": 30,
    "maxItems": 30,
}
GRAMMAR = {"response_format": {"type": "json_schema", "json_schema": {"name": "numbers", "schema": SCHEMA}}}
PROMPTS = bench.random_prompts(32, words=24)


def compile_times(count: int = 50) -> dict[str, float]:
    """Milliseconds to check (compile) a generated schema's grammar, and to make its matcher."""
    draw = random.Random(7)
    grammars = Grammars.from_folder(tiny_model_path(), vocab_rows=2048, eos_token_ids=[2])
    checks, matchers = [], []
    for _ in range(count):
        guided = GuidedDecoding("json", random_schema(draw), "response_format.json_schema.schema")
        started = time.perf_counter()
        guided.check()
        checked = time.perf_counter()
        grammars.matcher(guided, [1])
        matchers.append((time.perf_counter() - checked) * 1000)
        checks.append((checked - started) * 1000)

    def p90(values: list[float]) -> float:
        return statistics.quantiles(values, n=10)[-1]

    return {
        "schemas": count,
        "check_p50_ms": statistics.median(checks),
        "check_p90_ms": p90(checks),
        "matcher_p50_ms": statistics.median(matchers),
        "matcher_p90_ms": p90(matchers),
    }


async def main(requests: int) -> dict[str, Any]:
    rows = []
    async with await DistributedRuntime.create() as runtime:
        engine = await HFEngine.load(tiny_model_path())
        await serve_engine(runtime, WorkerRole(), tiny_model_path(), MODEL, lambda kv_events: engine)
        frontend = await Frontend.start(runtime, port=0)
        await frontend.wait_for_model(MODEL)
        try:
            options = {"prompts": PROMPTS, "max_tokens": TOKENS, "temperature": 0}
            await level_figures(frontend.url, MODEL, 4, 8, **options)  # warm-up
            for level in LEVELS:
                count = max(requests // (4 if level == 1 else 1), 2 * level)
                free = await level_figures(frontend.url, MODEL, level, count, ignore_eos=True, **options)
                guided = await level_figures(frontend.url, MODEL, level, count, extra_body=GRAMMAR, **options)
                free_tps = free["req_per_s"] * free["mean_output_tokens"]
                guided_tps = guided["req_per_s"] * guided["mean_output_tokens"]
                rows.append({
                    "concurrency": level, "free": free, "grammar": guided,
                    "free_tokens_per_s": free_tps, "grammar_tokens_per_s": guided_tps,
                    "ratio_tokens_per_s": guided_tps / free_tps,
                })  # fmt: skip
        finally:
            await frontend.stop()
            await engine.close()
    return {
        "benchmark": "structured_output",
        "machine": machine(),
        "engine": "hf (the built-in tiny model, CPU), behind the frontend in this process",
        "schema": SCHEMA,
        "tokens": TOKENS,
        "requests": requests,
        "rows": rows,
        "compile": compile_times(),
        "note": "ratio = tokens/s with the grammar / without (1.0: the grammar costs nothing)",
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'c':>3}  {'tok/s free':>10} {'grammar':>8} {'ratio':>6}  {'TTFT p50 free':>13} {'grammar':>8}"
          f"  {'ITL p50 free':>12} {'grammar':>8}  {'tokens free':>11} {'grammar':>8}")  # fmt: skip
    for row in result["rows"]:
        a, b = row["free"], row["grammar"]
        print(f"{row['concurrency']:>3}  {row['free_tokens_per_s']:>10.0f} {row['grammar_tokens_per_s']:>8.0f}"
              f" {row['ratio_tokens_per_s']:>6.2f}  {a['ttft_p50_ms']:>13.2f} {b['ttft_p50_ms']:>8.2f}"
              f"  {a['itl_p50_ms']:>12.2f} {b['itl_p50_ms']:>8.2f}  {a['mean_output_tokens']:>11.1f}"
              f" {b['mean_output_tokens']:>8.1f}")  # fmt: skip
    c = result["compile"]
    print(f"grammar compile per schema ({c['schemas']} generated): check p50 {c['check_p50_ms']:.2f} ms, "
          f"p90 {c['check_p90_ms']:.2f} ms; matcher p50 {c['matcher_p50_ms']:.2f} ms, p90 {c['matcher_p90_ms']:.2f} ms")  # fmt: skip
    print(result["note"])


if __name__ == "__main__":
    run_benchmark(__doc__ or "", "structured_output", main, print_table, requests=96,
                  requests_help="requests per case at concurrency 8 (a quarter at 1)")  # fmt: skip
