"""KV-aware routing against round robin, on the same workload, in one run.

Identical graphs over etcd + NATS, each one mocker process with 4 engines (limited KV pools,
Dynamo's timing model at speedup 1, chunked prefill with vLLM's 2048-token step budget)
behind its own frontend: one frontend routes round robin, one with ``--router-mode kv`` at the
default overlap weight (1: balances KV load as much as it follows the cache), one with
``--kv-overlap-score-weight 4`` (favours cache hits, for TTFT), and one kv frontend as two
processes on one port (``--http-workers 2``: each router sees the same KV events but counts
only its own requests' load). The workload is 16 long shared
system prompts (about 5.7 k tokens) with 32 short user turns each, in a seeded random order,
at concurrency 16 (4 requests per engine): round robin spreads every system prompt over all
four engines, whose pools cannot hold all 16; the KV router keeps each on an engine that has
it cached. The first request of each system prompt is a miss in every mode.

Reported per mode: TTFT mean/p50/p99, mean inter-token latency, e2e p50 and the prefix hit
rate the engines saw (cached prompt blocks / prompt blocks, from their ``stats`` endpoints).
Then the router's decision time per request with 10 k blocks indexed (hashing a 1024-token
prompt, find_matches, costs, pick), measured in this process.

    python benchmarks/kv_routing.py [--requests 512] [--out benchmarks/results/kv_routing.json]
"""

from __future__ import annotations

import os
import platform
import random
import time
from typing import Any

from _harness import run_benchmark

from dynamo_nb import DistributedRuntime, LocalServices, bench, launch, launched
from dynamo_nb.router.kv import KvRouter, KvRouterConfig

# label → the frontend's routing flags
MODES = {
    "round-robin": ["--router-mode", "round-robin"],
    "kv": ["--router-mode", "kv"],
    "kv-weight-4": ["--router-mode", "kv", "--kv-overlap-score-weight", "4"],
    # two frontend processes on one port, each with its own KV router (its own requests' load)
    "kv-2-frontends": ["--router-mode", "kv", "--http-workers", "2"],
}
GROUPS, SYSTEM_WORDS, USER_WORDS, TOKENS, CONCURRENCY = 16, 2300, 24, 16, 16
MOCKER_FLAGS = ["--num-workers", "4", "--num-gpu-blocks", "2400", "--kv-cache-block-size", "16",
                "--max-num-batched-tokens", "2048", "--context-length", "8192", "--speedup-ratio", "1"]  # fmt: skip


def workload(requests: int) -> list[bench.Prompt]:
    """``GROUPS`` shared system prompts with their user turns, in a seeded random order (so round
    robin does not line the groups up with the engines by accident)."""
    per_group = requests // GROUPS + 1
    groups = [
        bench.shared_prefix_prompts(per_group, system_words=SYSTEM_WORDS, user_words=USER_WORDS, seed=g)
        for g in range(GROUPS)
    ]
    prompts = [groups[i % GROUPS][i // GROUPS] for i in range(requests)]
    random.Random(7).shuffle(prompts)
    return prompts


def namespace(mode: str) -> str:
    return mode.replace("-", "")


async def start_mode(mode: str, etcd_url: str, nats_url: str) -> str:
    """A mocker process and a frontend for one routing mode (own namespace and model name); the URL."""
    bus = ["--discovery", etcd_url, "--nats-url", nats_url, "--log-level", "WARNING"]
    name = f"mock-{mode}"
    await launch("components/mocker_worker.py", *bus, *MOCKER_FLAGS, "--endpoint", f"{namespace(mode)}.backend.generate",
                 "--model-name", name, show_logs=False)  # fmt: skip
    frontend = await launch("components/frontend.py", *bus, "--http-port", 0, *MODES[mode], show_logs=False)
    await bench.wait_for_model(frontend.url, name, instances=4)
    return frontend.url


async def engine_hit_rate(runtime: DistributedRuntime, mode: str) -> float:
    client = await runtime.endpoint(f"{namespace(mode)}.backend.stats").client()
    await client.wait_for_instances(timeout=10)
    hits = blocks = 0
    for instance in client.instance_ids():
        async for stats in client.direct({}, instance):
            hits, blocks = hits + stats["prefix_hits"], blocks + stats["prompt_blocks"]
    return hits / blocks if blocks else 0.0


async def decision_time(runtime: DistributedRuntime, mode: str, samples: int = 2000) -> dict[str, float]:
    """Microseconds per routing decision with 10 k blocks indexed over the graph's 4 engines."""
    client = await runtime.endpoint(f"{namespace(mode)}.backend.generate").client()
    router = KvRouter(client, 16, KvRouterConfig(use_kv_events=False), indexer=None)
    rng = random.Random(0)
    workers = client.instance_ids()
    for i in range(200):  # 200 chains of 50 blocks: 10 k blocks
        chain = [rng.getrandbits(64) for _ in range(50)]
        router.tree.store(
            workers[i % len(workers)], None, [{"block_hash": h, "tokens_hash": h} for h in chain]
        )
    prompt = [rng.randrange(400) for _ in range(1024)]
    started = time.perf_counter()
    for n in range(samples):
        router.choose(prompt, f"r{n}")
        router.finished(router.choose(prompt, f"s{n}"))
    elapsed = (time.perf_counter() - started) / (2 * samples)
    return {"blocks_indexed": router.tree.block_count(), "prompt_tokens": 1024, "decision_us": elapsed * 1e6}


async def main(requests: int) -> dict[str, Any]:
    services = await LocalServices.start()
    runtime = await DistributedRuntime.create(services.etcd_url, "tcp", services.nats_url)
    report: dict[str, Any] = {}
    try:
        urls = {mode: await start_mode(mode, services.etcd_url, services.nats_url) for mode in MODES}
        prompts = workload(requests)
        for mode in MODES:
            df = await bench.run(urls[mode], f"mock-{mode}", prompts=prompts, concurrency=CONCURRENCY, requests=requests,
                                 max_tokens=TOKENS, progress=False, label=mode)  # fmt: skip
            failed = df["error"].dropna()
            if len(failed):
                raise SystemExit(f"{mode}: {len(failed)} requests failed, first: {failed.iloc[0]}")
            ttft = df["ttft_s"] * 1000
            gaps = [gap for row in df["itl_s"] for gap in row]
            report[mode] = {
                "requests": len(df),
                "ttft_mean_ms": float(ttft.mean()),
                "ttft_p50_ms": float(ttft.quantile(0.5)),
                "ttft_p99_ms": float(ttft.quantile(0.99)),
                "itl_mean_ms": 1000 * sum(gaps) / len(gaps),
                "e2e_p50_ms": float((df["e2e_s"] * 1000).quantile(0.5)),
                "prefix_hit_rate": await engine_hit_rate(runtime, mode),
            }
        baseline = report["round-robin"]["ttft_mean_ms"]
        report["ttft_mean_over_round_robin"] = {
            mode: report[mode]["ttft_mean_ms"] / baseline for mode in MODES if mode != "round-robin"
        }
        report["router_decision"] = await decision_time(runtime, "kv")
    finally:
        for process in launched():
            await process.stop()
        await runtime.shutdown()
        await services.stop()
    report["meets_ttft_target"] = {
        mode: ratio <= 0.5 for mode, ratio in report["ttft_mean_over_round_robin"].items()
    }
    report["meets_decision_target"] = report["router_decision"]["decision_us"] <= 200
    report["setup"] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "workload": f"{GROUPS} system prompts of {SYSTEM_WORDS} words, user turns of {USER_WORDS} words, "
        f"{TOKENS} output tokens, concurrency {CONCURRENCY}",
        "mocker": " ".join(MOCKER_FLAGS),
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\nMocker, 4 engines per mode; {report['setup']['workload']}")
    print(
        f"{'mode':<13}{'requests':>9}{'TTFT mean':>11}{'p50':>8}{'p99':>8}{'ITL mean':>10}{'e2e p50':>9}"
        f"{'prefix hits':>13}{'TTFT vs rr':>12}"
    )
    for mode in MODES:
        row = report[mode]
        ratio = report["ttft_mean_over_round_robin"].get(mode, 1.0)
        print(
            f"{mode:<13}{row['requests']:>9}{row['ttft_mean_ms']:>11.1f}{row['ttft_p50_ms']:>8.1f}"
            f"{row['ttft_p99_ms']:>8.1f}{row['itl_mean_ms']:>10.1f}{row['e2e_p50_ms']:>9.1f}"
            f"{row['prefix_hit_rate']:>12.0%}{ratio:>12.2f}"
        )
    decision = report["router_decision"]
    print("target: kv mean TTFT ≤ 0.5× round robin:", report["meets_ttft_target"])
    print(
        f"router decision: {decision['decision_us']:.1f} µs with {decision['blocks_indexed']} blocks indexed (target ≤ 200)"
    )


if __name__ == "__main__":
    run_benchmark(__doc__, "kv_routing", main, print_table, requests=512, requests_help="requests per mode")
