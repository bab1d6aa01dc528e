"""TTFT and end-to-end of the three serving paths, on the same prompts, in one run.

Processes over etcd + TCP, all serving the built-in tiny model:
- an aggregated hf worker (model ``tiny-agg``);
- for model ``tiny-llama``: one decode worker and two prefill workers, one publishing its
  bootstrap server (the frontend takes the **fast** path with it) and one not (the
  **fallback** path: the frontend waits for the prefill's ``disaggregated_params``);
- one frontend for both models.

Requests go one at a time (greedy, 16 tokens), alternating between the models, so the
frontend's round robin alternates the two prefill workers; each request's path comes back
in its ``x-dynamo-path`` header. The report is keyed by path: TTFT p50/p99 and end-to-end
p50/p99 (ms), and the ratio fast/fallback TTFT.

    python benchmarks/disagg.py [--requests 60] [--out benchmarks/results/disagg.json]
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pandas as pd
from _harness import machine, run_benchmark

from dynamo_nb import LocalServices, ManagedProcess, bench, launch, launched

PATHS = ("aggregated", "fast", "fallback")
PROMPTS = bench.random_prompts(20, words=200, seed=1)
TOKENS = 16


WORKERS = {
    "aggregated": ("--endpoint", "agg.backend.generate", "--model-name", "tiny-agg"),
    "decode": ("--mode", "decode"),
    "fast prefill": ("--mode", "prefill"),
    "fallback prefill": ("--mode", "prefill", "--no-bootstrap-endpoint"),
}
"""The workers of the graph, by role, with their flags."""

Start = Callable[..., Awaitable[ManagedProcess]]


async def start_graph(
    etcd_url: str, start: Callable[[str], Start] = lambda role: launch, **frontend: Any
) -> str:
    """The workers and the frontend (``start(role)`` is the launcher of a role: ``launch`` here,
    a host's in ``disagg_hosts.py``); returns the frontend's URL."""
    common = ["--discovery", etcd_url, "--log-level", "WARNING"]
    one_thread = {"OMP_NUM_THREADS": "1"}
    await asyncio.gather(
        *(
            start(role)("components/hf_worker.py", *common, *flags, env=one_thread, show_logs=False)
            for role, flags in WORKERS.items()
        )
    )
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in frontend.items()]
    process = await start("frontend")(
        "components/frontend.py", *common, "--http-port", 0, *flags, show_logs=False
    )
    await bench.wait_for_model(process.url, "tiny-agg")
    await bench.wait_for_model(process.url, "tiny-llama")
    return str(process.url)


async def measure(url: str, requests: int) -> pd.DataFrame:
    """Warm every process up, then ``requests`` rounds of one aggregated and two disaggregated
    requests (the round robin alternates the two prefill workers: one fast, one fallback)."""
    options = {"prompts": PROMPTS, "concurrency": 1, "max_tokens": TOKENS, "temperature": 0,
               "ignore_eos": True, "progress": False}  # fmt: skip
    for model in ("tiny-agg", "tiny-llama"):
        await bench.run(url, model, requests=4, **options)
    frames = []
    for _ in range(requests):  # interleaved: drifts in the machine hit every path alike
        frames.append(await bench.run(url, "tiny-agg", requests=1, **options))
        frames.append(await bench.run(url, "tiny-llama", requests=2, **options))
    df = pd.concat(frames, ignore_index=True)
    failed = df["error"].dropna()
    if len(failed):
        raise SystemExit(f"{len(failed)} requests failed, first: {failed.iloc[0]}")
    return df


def by_path(df: pd.DataFrame) -> dict[str, Any]:
    """TTFT and end-to-end p50/p99 (ms) per path, and fast/fallback TTFT p50."""
    report: dict[str, Any] = {}
    for path in PATHS:
        rows = df[df["path"] == path]
        ttft, e2e = rows["ttft_s"] * 1000, rows["e2e_s"] * 1000
        report[path] = {
            "requests": len(rows),
            "ttft_p50_ms": float(ttft.quantile(0.5)),
            "ttft_p99_ms": float(ttft.quantile(0.99)),
            "e2e_p50_ms": float(e2e.quantile(0.5)),
            "e2e_p99_ms": float(e2e.quantile(0.99)),
        }
    report["fast_over_fallback_ttft_p50"] = report["fast"]["ttft_p50_ms"] / report["fallback"]["ttft_p50_ms"]
    report["fast_beats_fallback"] = report["fast"]["ttft_p50_ms"] < report["fallback"]["ttft_p50_ms"]
    return report


async def main(requests: int) -> dict[str, Any]:
    services = await LocalServices.start(nats=False)
    try:
        url = await start_graph(str(services.etcd_url))
        df = await measure(url, requests)
    finally:
        for process in launched():
            await process.stop()
        await services.stop()
    report = by_path(df)
    report["setup"] = {
        "machine": machine(),
        "prompt_words": 200,
        "tokens_per_request": TOKENS,
        "note": "one request at a time; client, frontend and four workers share the machine",
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\nTiny model, {TOKENS}-token greedy requests one at a time (ms)")
    print(f"{'path':<12}{'requests':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'e2e p50':>10}{'e2e p99':>10}")
    for path in PATHS:
        row = report[path]
        print(
            f"{path:<12}{row['requests']:>9}{row['ttft_p50_ms']:>10.2f}{row['ttft_p99_ms']:>10.2f}"
            f"{row['e2e_p50_ms']:>10.2f}{row['e2e_p99_ms']:>10.2f}"
        )
    verdict = "beats" if report["fast_beats_fallback"] else "DOES NOT beat"
    print(
        f"fast/fallback TTFT p50: {report['fast_over_fallback_ttft_p50']:.2f} (the fast path {verdict} the fallback)"
    )


if __name__ == "__main__":
    run_benchmark(__doc__, "disagg", main, print_table, requests=60, requests_help="requests per path")
