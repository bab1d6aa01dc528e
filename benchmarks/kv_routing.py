"""KV-aware routing against round robin, on the same workload, in one run.

Identical graphs over etcd + NATS, each one mocker process with 4 engines (limited KV pools,
Dynamo's timing model at speedup 1, chunked prefill with vLLM's 2048-token step budget)
behind its own frontend: one frontend routes round robin, one with ``--router-mode kv`` at the
default overlap weight (1: balances KV load as much as it follows the cache), one with
``--kv-overlap-score-weight 4`` (favours cache hits, for TTFT), and a kv frontend as two
processes on one port (``--http-workers 2``), once with the routers sharing their decisions
(replica sync, the default) and once without (``--no-router-replica-sync``: each counts only
its own requests' load and routes). The workload is 16 long shared
system prompts (about 5.7 k tokens) with 32 short user turns each, in a seeded random order,
at concurrency 16 (4 requests per engine): round robin spreads every system prompt over all
four engines, whose pools cannot hold all 16; the KV router keeps each on an engine that has
it cached. The first request of each system prompt is a miss in every mode. The kv modes at
weight 1 run ``ROUNDS`` times, interleaved, each round with new system prompts, so the spread
of one frontend's hit rate over the rounds is the noise the two-process modes are judged by.

Reported per mode: TTFT mean/p50/p99, mean inter-token latency, e2e p50 and the prefix hit
rate the engines saw (cached prompt blocks / prompt blocks, from their ``stats`` endpoints).
Then the router's decision time per request with 10 k blocks indexed (hashing a 1024-token
prompt, find_matches, costs, pick), measured in this process.

    python benchmarks/kv_routing.py [--requests 512] [--out benchmarks/results/kv_routing.json]
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from _harness import machine, run_benchmark

from dynamo_nb import DistributedRuntime, LocalServices, bench, launch, launched
from dynamo_nb.router.kv import KvRouter, KvRouterConfig

# label → the frontend's routing flags
MODES = {
    "round-robin": ["--router-mode", "round-robin"],
    "kv": ["--router-mode", "kv"],
    "kv-weight-4": ["--router-mode", "kv", "--kv-overlap-score-weight", "4"],
    # two frontend processes on one port, their KV routers sharing decisions over NATS
    "kv-2-frontends": ["--router-mode", "kv", "--http-workers", "2"],
    # the same, each router on its own (its own requests' load and routes)
    "kv-2-unshared": ["--router-mode", "kv", "--http-workers", "2", "--no-router-replica-sync"],
}
REPEATED = ("kv", "kv-2-frontends", "kv-2-unshared")  # run ROUNDS times, interleaved
ROUNDS = 5
GROUPS, SYSTEM_WORDS, USER_WORDS, TOKENS, CONCURRENCY = 16, 2300, 24, 16, 16
MOCKER_FLAGS = ["--num-workers", "4", "--num-gpu-blocks", "2400", "--kv-cache-block-size", "16",
                "--max-num-batched-tokens", "2048", "--context-length", "8192", "--speedup-ratio", "1"]  # fmt: skip


def workload(requests: int, round_: int = 0) -> list[bench.Prompt]:
    """``GROUPS`` shared system prompts with their user turns, in a seeded random order (so round
    robin does not line the groups up with the engines by accident); each round its own prompts."""
    per_group = requests // GROUPS + 1
    groups = [
        bench.shared_prefix_prompts(
            per_group, system_words=SYSTEM_WORDS, user_words=USER_WORDS, seed=g + 1000 * round_
        )
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


async def engine_blocks(runtime: DistributedRuntime, mode: str) -> tuple[int, int]:
    """Prompt blocks the mode's engines found cached, and prompt blocks, so far."""
    client = await runtime.endpoint(f"{namespace(mode)}.backend.stats").client()
    await client.wait_for_instances(timeout=10)
    hits = blocks = 0
    for instance in client.instance_ids():
        async for stats in client.direct({}, instance):
            hits, blocks = hits + stats["prefix_hits"], blocks + stats["prompt_blocks"]
    return hits, blocks


async def run_mode(
    runtime: DistributedRuntime, mode: str, url: str, prompts: list[bench.Prompt]
) -> dict[str, Any]:
    """One run of ``prompts`` against a mode: latencies and the prefix hit rate of this run."""
    hits_before, blocks_before = await engine_blocks(runtime, mode)
    df = await bench.run(url, f"mock-{mode}", prompts=prompts, concurrency=CONCURRENCY, requests=len(prompts),
                         max_tokens=TOKENS, progress=False, label=mode)  # fmt: skip
    failed = df["error"].dropna()
    if len(failed):
        raise SystemExit(f"{mode}: {len(failed)} requests failed, first: {failed.iloc[0]}")
    hits, blocks = await engine_blocks(runtime, mode)
    ttft = df["ttft_s"] * 1000
    gaps = [gap for row in df["itl_s"] for gap in row]
    return {
        "requests": len(df),
        "ttft_mean_ms": float(ttft.mean()),
        "ttft_p50_ms": float(ttft.quantile(0.5)),
        "ttft_p99_ms": float(ttft.quantile(0.99)),
        "itl_mean_ms": 1000 * sum(gaps) / len(gaps),
        "e2e_p50_ms": float((df["e2e_s"] * 1000).quantile(0.5)),
        "prefix_hit_rate": (hits - hits_before) / max(blocks - blocks_before, 1),
    }


def two_frontends(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Two frontend processes against one, round by round (each round the same prompts): the
    mean difference of the prefix hit rate and its noise, two standard errors of that mean."""
    one = [run["prefix_hit_rate"] for run in runs["kv"]]
    report: dict[str, Any] = {"kv_hit_rates": one}
    for mode, key in (("kv-2-frontends", "shared"), ("kv-2-unshared", "unshared")):
        differences = [run["prefix_hit_rate"] - base for run, base in zip(runs[mode], one, strict=True)]
        mean = statistics.fmean(differences)
        noise = 2 * statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0
        report[key] = {"hit_rates": [run["prefix_hit_rate"] for run in runs[mode]], "minus_one": mean, "noise": noise,
                       "within_noise": abs(mean) <= max(noise, 0.01)}  # fmt: skip
    return report


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' mean of every figure, the runs kept."""
    row: dict[str, Any] = {key: sum(run[key] for run in runs) / len(runs) for key in runs[0]}
    row["requests"] = sum(run["requests"] for run in runs)
    if len(runs) > 1:
        row["runs"] = runs
    return row


async def decision_time(runtime: DistributedRuntime, mode: str, samples: int = 2000) -> dict[str, float]:
    """Microseconds per routing decision with 10 k blocks indexed over the graph's 4 engines."""
    client = await runtime.endpoint(f"{namespace(mode)}.backend.generate").client()
    router = KvRouter(client, 16, KvRouterConfig(use_kv_events=False))
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
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for round_ in range(ROUNDS):
            prompts = workload(requests, round_)
            for mode in MODES if round_ == 0 else REPEATED:
                runs[mode].append(await run_mode(runtime, mode, urls[mode], prompts))
        for mode in MODES:
            report[mode] = mean_of(runs[mode])
        baseline = report["round-robin"]["ttft_mean_ms"]
        report["ttft_mean_over_round_robin"] = {
            mode: report[mode]["ttft_mean_ms"] / baseline for mode in MODES if mode != "round-robin"
        }
        report["two_frontends"] = two_frontends(runs)
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
        "machine": machine(),
        "workload": f"{GROUPS} system prompts of {SYSTEM_WORDS} words, user turns of {USER_WORDS} words, "
        f"{TOKENS} output tokens, concurrency {CONCURRENCY}; {', '.join(REPEATED)}: the mean of {ROUNDS} rounds",
        "mocker": " ".join(MOCKER_FLAGS),
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\nMocker, 4 engines per mode; {report['setup']['workload']}")
    print(
        f"{'mode':<15}{'requests':>9}{'TTFT mean':>11}{'p50':>8}{'p99':>8}{'ITL mean':>10}{'e2e p50':>9}"
        f"{'prefix hits':>13}{'TTFT vs rr':>12}"
    )
    for mode in MODES:
        row = report[mode]
        ratio = report["ttft_mean_over_round_robin"].get(mode, 1.0)
        print(
            f"{mode:<15}{row['requests']:>9}{row['ttft_mean_ms']:>11.1f}{row['ttft_p50_ms']:>8.1f}"
            f"{row['ttft_p99_ms']:>8.1f}{row['itl_mean_ms']:>10.1f}{row['e2e_p50_ms']:>9.1f}"
            f"{row['prefix_hit_rate']:>12.0%}{ratio:>12.2f}"
        )
    two = report["two_frontends"]
    for key in ("shared", "unshared"):
        row = two[key]
        print(
            f"two frontend processes ({key}) vs one, prefix hit rate per round: {row['minus_one']:+.1%} "
            f"± {row['noise']:.1%} (two standard errors, {ROUNDS} rounds): within noise: {row['within_noise']}"
        )
    decision = report["router_decision"]
    print("target: kv mean TTFT ≤ 0.5× round robin:", report["meets_ttft_target"])
    print(
        f"router decision: {decision['decision_us']:.1f} µs with {decision['blocks_indexed']} blocks indexed (target ≤ 200)"
    )


if __name__ == "__main__":
    run_benchmark(__doc__, "kv_routing", main, print_table, requests=512, requests_help="requests per mode")
