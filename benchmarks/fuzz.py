"""The HTTP API fuzzed at length: 10,000 generated requests (new ones each run) against a
frontend serving the echo engine, as the suite's fuzz test does with 2,000 fixed ones.

Reported: the answers by status, the problems (a 5xx, an error outside OpenAI's envelope, a
200 that is not a completion or a stream ending in ``[DONE]``) with their requests, whether
the server still serves afterwards, and requests per second through the whole check.

    python benchmarks/fuzz.py [--requests 10000] [--out benchmarks/results/fuzz.json]
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb import launch
from dynamo_nb.bench import fuzz


async def main(requests: int) -> dict[str, Any]:
    server = await launch(
        "-m", "dynamo_nb", "run", "--in", "http", "--out", "echo", "--http-port", 0, "--log-level", "ERROR",
        ready="^READY frontend", show_logs=False,
    )  # fmt: skip
    try:
        started = time.perf_counter()
        report = await asyncio.to_thread(fuzz.fuzz, server.url, "tiny-llama", examples=requests, seed=None)
        elapsed = time.perf_counter() - started
    finally:
        await server.stop()
    report["requests_per_s"] = report["examples"] / elapsed
    report["meets_target"] = report["problem_count"] == 0 and report["alive"]
    report["setup"] = {
        "machine": machine(),
        "server": "python -m dynamo_nb run --in http --out echo (the built-in tiny model's tokenizer)",
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['examples']} generated requests, {report['requests_per_s']:.0f}/s")
    print(f"{'status':>8}{'answers':>10}")
    for status, count in report["statuses"].items():
        print(f"{status:>8}{count:>10}")
    print(f"problems: {report['problem_count']}; server alive afterwards: {report['alive']}")
    for problem in report["problems"][:5]:
        print(f"  {problem['problem']}: {problem['path']} {problem['body'][:120]}")


if __name__ == "__main__":
    run_benchmark(__doc__, "fuzz", main, print_table, requests=10000, requests_help="generated requests")
