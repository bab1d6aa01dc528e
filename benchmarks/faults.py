"""A worker SIGKILLed in the middle of a load run, with request migration on and off.

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


async def main(requests: int) -> dict[str, Any]:
    services = await LocalServices.start()
    report: dict[str, Any] = {}
    try:
        for label, limit in SCENARIOS.items():
            report[label] = await scenario(services, label, limit, requests)
    finally:
        for process in launched():
            await process.stop()
        await services.stop()
    on = report["migration on"]
    report["meets_target"] = (
        on["complete_with_all_tokens"] == on["requests"] and report["migration off"]["hung"] == 0
    )
    report["setup"] = {
        "machine": machine(),
        "workload": f"{requests} streaming requests of {TOKENS} tokens at concurrency {CONCURRENCY}, "
        "two mocker workers (speedup 1), one SIGKILLed when half have finished",
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


if __name__ == "__main__":
    run_benchmark(__doc__, "faults", main, print_table, requests=200, requests_help="requests per scenario")
