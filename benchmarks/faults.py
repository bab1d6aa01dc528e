"""Workers that die and workers that hang, in the middle of a load run.

**Killed** (SIGKILL), with request migration on and off.

Per scenario: etcd, two mocker worker processes (one engine each, Dynamo's timing at speedup
1, so a 64-token stream lasts ~0.4 s) and a frontend over the TCP request plane; 200 streaming
requests at concurrency 20 (eos ignored, so every complete answer has exactly 64 tokens). When
half the requests have finished, one worker is SIGKILLed. With ``--migration-limit 3`` (the
default) every request must complete with all its tokens; with ``--migration-limit 0`` the
requests the dead worker was streaming end with an error event, and none hangs.

Reported per scenario: requests complete with the full token count, errors (and the first
error's text), migrations counted by the frontend, the slowest request, and how long after the
kill the dead worker still took a request (the last request whose first token came from it,
sent after the kill; none: the frontend stopped at once).

**Frozen** (SIGSTOP, then SIGCONT: alive to discovery and its connection, sending nothing), with
the frontend's hung-worker watchdog on and off (``--no-hang-watchdog``, the baseline in the same run),
every worker's lease longer than the freeze:

- an aggregated mocker worker of two frozen for 20 s under 20 streams in flight (speedup 1, 64 tokens);
- an hf prefill worker of two (one hf decode) frozen for 40 s under 8 streams in flight (32 tokens);

reported: requests complete, errors, the longest stall of any stream (its largest gap between two
tokens), the TTFT of the requests sent during the freeze (p50, max) against the TTFT before it, and the
watchdog's counters.

**Not hung** (no false positives): 2,000 requests on two mocker workers, one slowed 3x by design
(``--speedup-ratio`` a third of the other's), with prompts of 1 k to 30 k tokens (``--context-length
32768``); reported: suspicions raised (the target: none) and requests complete.

    python benchmarks/faults.py [--requests 200] [--out benchmarks/results/faults.json]
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx
from _harness import machine, run_benchmark
from prometheus_client.parser import text_string_to_metric_families

from dynamo_nb import LocalServices, bench, launch, launched

CONCURRENCY, TOKENS = 20, 64
SCENARIOS = {"migration on": 3, "migration off": 0}
WATCHDOG = {"watchdog on": (), "watchdog off": ("--no-hang-watchdog",)}
LONG_LEASE = ("--lease-ttl", "120")  # outlives every freeze: only the watchdog (or a heartbeat) notices


def metric_total(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text page."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def scenario(
    services: LocalServices, label: str, migration_limit: int, requests: int
) -> dict[str, Any]:
    """Two workers and a frontend, a load run, one worker killed half-way; what the clients saw."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--log-level", "ERROR"]
    name = f"faults-{migration_limit}"
    endpoint = f"faults{migration_limit}.backend.generate"
    mocker = ["--speedup-ratio", "1", "--model-name", name, "--endpoint", endpoint, "--lease-ttl", "2"]
    workers = [await launch("components/mocker_worker.py", *bus, *mocker, show_logs=False) for _ in range(2)]
    frontend = await launch(
        "components/frontend.py",
        *bus,
        "--http-port",
        0,
        "--migration-limit",
        migration_limit,
        show_logs=False,
    )
    await bench.wait_for_model(frontend.url, name, instances=2)
    victim = workers[0]
    started = time.perf_counter()
    run = asyncio.create_task(
        bench.run(
            frontend.url,
            name,
            concurrency=CONCURRENCY,
            requests=requests,
            max_tokens=TOKENS,
            ignore_eos=True,
            progress=False,
            label=label,
        )
    )
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
        while not run.done():
            finished = metric_total((await http.get("/metrics")).text, "dynamo_frontend_requests_total")
            if finished >= requests // 2:
                break
            await asyncio.sleep(0.01)
        killed_s = time.perf_counter() - started
        victim.send_signal(signal.SIGKILL)
        df = await run
        migrations = metric_total((await http.get("/metrics")).text, "dynamo_frontend_migrations_total")
    for process in (frontend, *workers):
        await process.stop()
    errors = df["error"].dropna()
    dead = f"{victim.instance_id:x}"
    after_kill = df[(df["worker"] == dead) & (df["sent_s"] > killed_s)]
    return {
        "migration_limit": migration_limit,
        "requests": len(df),
        "complete_with_all_tokens": int(((df["error"].isna()) & (df["output_tokens"] == TOKENS)).sum()),
        "errors": len(errors),
        "first_error": errors.iloc[0] if len(errors) else None,
        "hung": int(errors.str.contains("no complete answer").sum()) if len(errors) else 0,
        "migrations": migrations,
        "killed_at_s": killed_s,
        "slowest_request_s": float(df["e2e_s"].max()),
        "e2e_p50_s": float(df["e2e_s"].quantile(0.5)),
        "dead_worker_took_requests_until_s_after_kill": (
            float(after_kill["sent_s"].max() - killed_s) if len(after_kill) else None
        ),
    }


def longest_stall_s(df: Any) -> float:
    """The largest gap between two tokens of any request (its first token excluded)."""
    return float(max((max(gaps) for gaps in df["itl_s"] if len(gaps)), default=0.0))


def hang_figures(df: Any, frozen_at: float, thawed_at: float, tokens: int) -> dict[str, Any]:
    """What the clients saw of a freeze: completions, errors, the longest stall, TTFT during vs before."""
    during = df[(df["sent_s"] >= frozen_at) & (df["sent_s"] < thawed_at)]
    before = df[df["sent_s"] < frozen_at]
    errors = df["error"].dropna()
    return {
        "requests": len(df),
        "complete_with_all_tokens": int(((df["error"].isna()) & (df["output_tokens"] == tokens)).sum()),
        "errors": len(errors),
        "first_error": errors.iloc[0] if len(errors) else None,
        "longest_stall_s": longest_stall_s(df),
        "ttft_p50_before_s": float(before["ttft_s"].median()),
        "sent_during_freeze": len(during),
        "ttft_p50_during_s": float(during["ttft_s"].median()) if len(during) else None,
        "ttft_max_during_s": float(during["ttft_s"].max()) if len(during) else None,
        "ttft_max_s": float(df["ttft_s"].max()),
    }


async def watchdog_counters(url: str, model: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    return {
        name: metric_total(text, f"dynamo_frontend_{name}_total")
        for name in ("hung_instances", "canaries", "migrations", "prefill_errors")
    }


async def freeze(
    victim: Any, url: str, model: str, load: Any, freeze_s: float, started: float
) -> tuple[Any, float, float]:
    """Freeze ``victim`` once a request finished, for ``freeze_s``; the load's records and when (s from ``started``)."""
    run = asyncio.create_task(load)
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while not run.done():
            if metric_total((await http.get("/metrics")).text, "dynamo_frontend_requests_total") >= 1:
                break
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # streams in flight
    victim.send_signal(signal.SIGSTOP)
    frozen_at = time.perf_counter() - started
    try:
        await asyncio.wait({run}, timeout=freeze_s)
    finally:
        victim.send_signal(signal.SIGCONT)
    thawed_at = time.perf_counter() - started
    return await run, frozen_at, thawed_at


async def frozen_aggregated(
    services: LocalServices, label: str, flags: tuple[str, ...], requests: int
) -> dict[str, Any]:
    """Two mocker workers; one frozen for 20 s under 20 streams."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--log-level", "ERROR"]
    name = f"hang-{len(flags)}"
    mocker = [
        "--speedup-ratio",
        "1",
        "--model-name",
        name,
        "--endpoint",
        f"hang{len(flags)}.backend.generate",
        *LONG_LEASE,
    ]
    workers = [await launch("components/mocker_worker.py", *bus, *mocker, show_logs=False) for _ in range(2)]
    frontend = await launch("components/frontend.py", *bus, "--http-port", 0, *flags, show_logs=False)
    await bench.wait_for_model(frontend.url, name, instances=2)
    started = time.perf_counter()
    load = bench.run(frontend.url, name, concurrency=CONCURRENCY, requests=3 * requests, max_tokens=TOKENS,
                     ignore_eos=True, progress=False, label=label, timeout=120)  # fmt: skip
    df, frozen_at, thawed_at = await freeze(workers[0], frontend.url, name, load, 20.0, started)
    figures = {
        **hang_figures(df, frozen_at, thawed_at, TOKENS),
        **await watchdog_counters(frontend.url, name),
    }
    for process in (frontend, *workers):
        await process.stop()
    return figures


async def frozen_prefill(
    services: LocalServices, label: str, flags: tuple[str, ...], requests: int
) -> dict[str, Any]:
    """Two hf prefill workers and one hf decode (fast path); one prefill frozen for 40 s under 8 streams."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--log-level", "ERROR"]
    tag = f"pfhang{len(flags)}"
    endpoints = [
        "--endpoint",
        f"{tag}.backend.generate",
        "--prefill-endpoint",
        f"{tag}.prefill.generate",
        *LONG_LEASE,
    ]
    prefills = [
        await launch("components/hf_worker.py", *bus, *endpoints, "--mode", "prefill", show_logs=False)
        for _ in range(2)
    ]
    decode = await launch("components/hf_worker.py", *bus, *endpoints, "--mode", "decode", show_logs=False)
    frontend = await launch("components/frontend.py", *bus, "--http-port", 0, *flags, show_logs=False)
    await bench.wait_for_model(frontend.url, "tiny-llama")
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
        while len((await http.get("/health")).json()["prefill_instances"]) < 2:  # noqa: ASYNC110 - polls HTTP
            await asyncio.sleep(0.05)
    started = time.perf_counter()
    load = bench.run(frontend.url, "tiny-llama", concurrency=8, requests=requests, max_tokens=32, ignore_eos=True,
                     progress=False, label=label, timeout=120)  # fmt: skip
    df, frozen_at, thawed_at = await freeze(prefills[0], frontend.url, "tiny-llama", load, 40.0, started)
    figures = {
        **hang_figures(df, frozen_at, thawed_at, 32),
        **await watchdog_counters(frontend.url, "tiny-llama"),
    }
    figures["paths"] = {str(k): int(v) for k, v in df["path"].value_counts().items()}
    for process in (frontend, decode, *prefills):
        await process.stop()
    return figures


async def not_hung(services: LocalServices, requests: int) -> dict[str, Any]:
    """Two mocker workers, one slowed 3x, prompts of 1 k to 30 k tokens: no suspicion is the target."""
    bus = ["--discovery", services.etcd_url, "--request-plane", "tcp", "--log-level", "ERROR"]
    base = [
        "--model-name",
        "slow",
        "--endpoint",
        "slow.backend.generate",
        "--context-length",
        "32768",
        *LONG_LEASE,
    ]
    workers = [
        await launch("components/mocker_worker.py", *bus, *base, "--speedup-ratio", speedup, show_logs=False)
        for speedup in ("10", "3.333")
    ]
    frontend = await launch("components/frontend.py", *bus, "--http-port", 0, show_logs=False)
    await bench.wait_for_model(frontend.url, "slow", instances=2)
    lengths = (
        1000,
        2000,
        4000,
        8000,
        16000,
        30000,
    )  # tokens ("word " is one); a number first: nothing cached
    prompts = [f"{i} " + "word " * (lengths[i % len(lengths)] - 2) for i in range(requests)]
    df = await bench.run(frontend.url, "slow", prompts=prompts, concurrency=16, requests=requests, max_tokens=32,
                         ignore_eos=True, progress=False, endpoint="completions", timeout=300)  # fmt: skip
    counters = await watchdog_counters(frontend.url, "slow")
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
        peak = metric_total((await http.get("/metrics")).text, "dynamo_frontend_worker_silence_peak")
    for process in (frontend, *workers):
        await process.stop()
    return {
        "requests": len(df),
        "complete_with_all_tokens": int(((df["error"].isna()) & (df["output_tokens"] == 32)).sum()),
        "suspicions": counters["hung_instances"],
        "silence_peak_share_of_deadline": peak,
        "prompt_tokens": [int(df["input_tokens"].min()), int(df["input_tokens"].max())],
        "by_worker": {str(k): int(v) for k, v in df["worker"].value_counts().items()},
    }


async def main(requests: int) -> dict[str, Any]:
    services = await LocalServices.start()
    report: dict[str, Any] = {}
    try:
        for label, limit in SCENARIOS.items():
            report[label] = await scenario(services, label, limit, requests)
        report["frozen aggregated worker"] = {
            label: await frozen_aggregated(services, label, flags, requests)
            for label, flags in WATCHDOG.items()
        }
        report["frozen prefill worker"] = {
            label: await frozen_prefill(services, label, flags, requests) for label, flags in WATCHDOG.items()
        }
        report["not hung"] = await not_hung(services, 10 * requests)
    finally:
        for process in launched():
            await process.stop()
        await services.stop()
    on = report["migration on"]
    report["meets_target"] = (
        on["complete_with_all_tokens"] == on["requests"] and report["migration off"]["hung"] == 0
    )
    watched = (
        report["frozen aggregated worker"]["watchdog on"],
        report["frozen prefill worker"]["watchdog on"],
    )
    report["hang_targets"] = {
        "longest stall <= 2 s (aggregated)": watched[0]["longest_stall_s"] <= 2.0,
        "TTFT during the freeze <= usual + 1 s (aggregated)": (watched[0]["ttft_max_during_s"] or 0)
        <= watched[0]["ttft_p50_before_s"] + 1.0,
        "TTFT <= usual + 2 s (prefill)": watched[1]["ttft_max_s"] <= watched[1]["ttft_p50_before_s"] + 2.0,
        "all complete": all(w["complete_with_all_tokens"] == w["requests"] for w in watched),
        "no false positive": report["not hung"]["suspicions"] == 0
        and report["not hung"]["complete_with_all_tokens"] == report["not hung"]["requests"],
    }
    report["setup"] = {
        "machine": machine(),
        "workload": f"{requests} streaming requests of {TOKENS} tokens at concurrency {CONCURRENCY}, "
        "two mocker workers (speedup 1), one SIGKILLed when half have finished",
        "hangs": f"frozen aggregated: {3 * requests} requests of {TOKENS} tokens at concurrency {CONCURRENCY}, "
        f"one of two mocker workers frozen 20 s; frozen prefill: {requests} requests of 32 tokens at "
        "concurrency 8, one of two hf prefill workers (one hf decode) frozen 40 s; not hung: "
        f"{10 * requests} requests, prompts of 1k-30k tokens, one of two mocker workers 3x slower",
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['setup']['workload']}")
    print(f"{'scenario':<15}{'complete':>10}{'errors':>8}{'hung':>6}{'migrations':>12}{'slowest s':>11}")
    for label in SCENARIOS:
        row = report[label]
        print(
            f"{label:<15}{row['complete_with_all_tokens']:>6}/{row['requests']:<3}{row['errors']:>8}{row['hung']:>6}"
            f"{row['migrations']:>12.0f}{row['slowest_request_s']:>11.2f}"
        )
    for label in SCENARIOS:
        row = report[label]
        until = row["dead_worker_took_requests_until_s_after_kill"]
        print(
            f"{label}: dead worker took requests until {until} s after the kill; first error: {row['first_error']}"
        )
    print("target (all complete with migration, none hangs without):", report["meets_target"])
    for scenario_name in ("frozen aggregated worker", "frozen prefill worker"):
        print(f"\n{scenario_name}")
        print(f"{'':<14}{'complete':>10}{'errors':>8}{'stall s':>9}{'TTFT p50 before':>17}{'during p50':>12}"
              f"{'during max':>12}{'hangs found':>13}")  # fmt: skip
        for label, row in report[scenario_name].items():
            print(f"{label:<14}{row['complete_with_all_tokens']:>6}/{row['requests']:<3}{row['errors']:>8}"
                  f"{row['longest_stall_s']:>9.2f}{row['ttft_p50_before_s']:>17.3f}"
                  f"{row['ttft_p50_during_s'] or 0:>12.3f}{row['ttft_max_during_s'] or 0:>12.3f}"
                  f"{row['hung_instances']:>13.0f}")  # fmt: skip
    quiet = report["not hung"]
    print(f"\nnot hung: {quiet['complete_with_all_tokens']}/{quiet['requests']} complete, prompts of "
          f"{quiet['prompt_tokens'][0]}-{quiet['prompt_tokens'][1]} tokens, {quiet['suspicions']:.0f} suspicions; "
          f"the longest silence reached {quiet['silence_peak_share_of_deadline']:.0%} of its hang deadline")  # fmt: skip
    print("hang targets:", report["hang_targets"])


if __name__ == "__main__":
    run_benchmark(__doc__, "faults", main, print_table, requests=200, requests_help="requests per scenario")
