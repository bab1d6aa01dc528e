"""Engines behind our frontend, against vLLM's own OpenAI server, on the same model and prompts.

One run, three servers of the built-in tiny model, all on this machine:
- ``ours+vllm``: our frontend and a vLLM worker (components/vllm_worker.py);
- ``ours+hf``: the same frontend and an hf worker (components/hf_worker.py);
- ``vllm serve``: vLLM's own OpenAI server (the peer), with the same engine flags as our
  vLLM worker (``--block-size 32``, a 256 MiB KV cache, one OpenMP thread unbound).

Each server runs alone on the machine (an idle vLLM engine keeps polling its queues, so two
side by side slow each other), at concurrency 1, 8 and 32; the three take turns, three times, so a
drift of the machine hits them alike. Streamed chat requests, greedy, 32 tokens each with
``ignore_eos``.
The report: output tokens/s, TTFT and ITL p50 per server and level, and the ratios ours+vllm
over ``vllm serve`` (throughput at concurrency 32 should be ≥ 0.9, TTFT p50 ≤ 1.2).

    python benchmarks/engines.py [--requests 64] [--out benchmarks/results/engines.json]

Needs vLLM (``pip install -e ".[vllm]"``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from _harness import machine, run_benchmark

from dynamo_nb import LocalServices, bench, launch, launched
from dynamo_nb.bench.stats import level_summary
from dynamo_nb.models import tiny_model_path
from dynamo_nb.runtime.addresses import free_port

LEVELS = (1, 8, 32)
ROUNDS = 3
TOKENS = 32
PROMPTS = bench.random_prompts(64, words=48, seed=3)
SERVERS = ("ours+vllm", "vllm serve", "ours+hf")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
VLLM_ENGINE_FLAGS = ["--block-size", "32", "--kv-cache-memory-bytes", str(256 << 20)]


async def start_server(label: str, etcd_url: str) -> tuple[str, str]:
    """One server (with our frontend for ours); returns (base URL, model name)."""
    common = ["--discovery", etcd_url, "--log-level", "WARNING"]
    if label == "vllm serve":
        port = free_port(bound_later=True)  # vLLM binds it once its engine is up
        await launch(
            "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_path()),
            "--served-model-name", "tiny-peer", "--host", "127.0.0.1", "--port", str(port), *VLLM_ENGINE_FLAGS,
            name="vllm_serve", env=ONE_THREAD, ready="Application startup complete", show_logs=False, timeout=300,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        await bench.wait_for_model(url, "tiny-peer")
        return url, "tiny-peer"
    if label == "ours+vllm":
        await launch("components/vllm_worker.py", *common, *VLLM_ENGINE_FLAGS, env=ONE_THREAD,
                     show_logs=False, timeout=300)  # fmt: skip
    else:
        await launch("components/hf_worker.py", *common, env=ONE_THREAD, show_logs=False)
    frontend = await launch("components/frontend.py", *common, "--http-port", 0, show_logs=False)
    await bench.wait_for_model(frontend.url, "tiny-llama")
    return frontend.url, "tiny-llama"


async def measure(label: str, etcd_url: str, requests: int, round_: int) -> pd.DataFrame:
    """Start ``label`` alone on the machine, warm it up, run every level, stop it."""
    try:
        url, model = await start_server(label, etcd_url)
        options = {"prompts": PROMPTS, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
                   "progress": False, "worker_ids": False, "label": label}  # fmt: skip
        await bench.run(url, model, concurrency=8, requests=16, **options)  # warm-up
        frames = [
            await bench.run(
                url, model, concurrency=level, requests=min(requests, max(16, 2 * level)), **options
            )
            for level in LEVELS
        ]
    finally:
        for process in launched():
            await process.stop(timeout=30)
    return pd.concat(frames, ignore_index=True).assign(round=round_)


async def main(requests: int) -> dict[str, Any]:
    services = await LocalServices.start(nats=False)
    try:
        # one server at a time: an idle vLLM engine still polls its queues and would slow the other
        frames = [
            await measure(label, services.etcd_url, requests, r) for r in range(ROUNDS) for label in SERVERS
        ]
        df = pd.concat(frames, ignore_index=True)
    finally:
        await services.stop()
    failed = df["error"].dropna()
    if len(failed):
        raise SystemExit(f"{len(failed)} requests failed, first: {failed.iloc[0]}")
    table: dict[str, dict[str, Any]] = {}
    for label in SERVERS:
        table[label] = {}
        for level in LEVELS:
            rows = df[(df["label"] == label) & (df["concurrency"] == level)]
            # throughput per round (each round is one closed-loop run), then the mean of the rounds
            rounds = [level_summary(group) for _, group in rows.groupby("round")]
            whole = level_summary(rows)
            table[label][str(level)] = {
                "requests": len(rows),
                "output_tok_per_s": sum(r["output_tok_per_s"] for r in rounds) / len(rounds),
                "output_tok_per_s_by_round": [r["output_tok_per_s"] for r in rounds],  # the drift
                "ttft_p50_ms": whole["ttft_p50_ms"],
                "ttft_p99_ms": whole["ttft_p99_ms"],
                "itl_p50_ms": whole["itl_p50_ms"],
            }
    ours, peer = table["ours+vllm"], table["vllm serve"]
    report: dict[str, Any] = {"servers": table}
    report["ratios_ours_vllm_over_vllm_serve"] = {
        level: {
            "throughput": ours[level]["output_tok_per_s"] / peer[level]["output_tok_per_s"],
            "ttft_p50": ours[level]["ttft_p50_ms"] / peer[level]["ttft_p50_ms"],
        }
        for level in map(str, LEVELS)
    }
    at32 = report["ratios_ours_vllm_over_vllm_serve"]["32"]
    report["meets_targets_at_32"] = {
        "throughput_ge_0_9": at32["throughput"] >= 0.9,
        "ttft_p50_le_1_2": at32["ttft_p50"] <= 1.2,
    }
    report["setup"] = {
        "machine": machine(),
        "model": "built-in tiny model (trained Llama, 1.57 M parameters, 2048-token vocabulary)",
        "tokens_per_request": TOKENS,
        "rounds": ROUNDS,
        "engine_flags": " ".join(VLLM_ENGINE_FLAGS) + " (both vLLM servers), OMP_NUM_THREADS=1, unbound",
        "note": "one server at a time (with the load generator and, for ours, our frontend); ABCABC rounds",
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\nTiny model, streamed chat, {TOKENS} greedy tokens per request")
    print(
        f"{'server':<12}{'conc':>5}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}  (ms)"
        "  tok/s by round"
    )
    for label, levels in report["servers"].items():
        for level, row in levels.items():
            by_round = " / ".join(f"{value:.0f}" for value in row["output_tok_per_s_by_round"])
            print(
                f"{label:<12}{level:>5}{row['output_tok_per_s']:>9.1f}{row['ttft_p50_ms']:>10.1f}"
                f"{row['ttft_p99_ms']:>10.1f}{row['itl_p50_ms']:>9.2f}        {by_round}"
            )
    print("\nours+vllm / vllm serve:")
    for level, ratio in report["ratios_ours_vllm_over_vllm_serve"].items():
        print(
            f"  concurrency {level:>2}: throughput {ratio['throughput']:.2f}×, TTFT p50 {ratio['ttft_p50']:.2f}×"
        )
    print(f"targets at 32 (throughput ≥ 0.9, TTFT ≤ 1.2): {report['meets_targets_at_32']}")


if __name__ == "__main__":
    run_benchmark(
        __doc__, "engines", main, print_table, requests=64, requests_help="most requests per level and run"
    )
