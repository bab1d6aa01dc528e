"""Offline replay: how fast it runs, and how close it comes to the same trace served live.

1. **Speed.** A synthetic 5-minute trace (``--requests`` requests, Poisson arrivals, 8 shared
   system prompts of 1 k tokens plus 512 tokens of each request's own, 200 output tokens) is
   replayed in virtual time on 4 aggregated workers (KV router) and on 2 prefill + 2 decode
   workers: the real routers and the mocker's scheduler on a simulated clock. Reported: the
   virtual seconds, the wall seconds, their ratio, and whether it met the target (1,000 requests
   of 5 minutes in at most 2 s).
2. **Fidelity.** A 1-minute trace (300 requests) is replayed offline and then live, each request
   sent at its time through a frontend (KV router) and mocker workers over etcd + NATS, both
   aggregated (2 workers) and disaggregated (1 prefill + 1 decode). The live run is compressed
   4× (engines ``--speedup-ratio 4``, arrivals 4× faster; its times multiplied back), so it
   takes 15 s. Reported: TTFT and ITL p50/p90 offline and live, the gap in ms and as a ratio,
   and the prefix-cached tokens of each.

    python benchmarks/replay.py [--requests 1000] [--out benchmarks/results/replay.json]
"""

from __future__ import annotations

import asyncio
import os
import platform
from typing import Any

from _harness import run_benchmark

from dynamo_nb import LocalServices, bench, launch
from dynamo_nb.replay import Fleet, MockerSettings, replay

SPEED_FLEETS = {"aggregated 4 workers": Fleet(workers=4), "disaggregated 2+2": Fleet(prefill=2, decode=2)}
FIDELITY_REQUESTS, FIDELITY_RATE, SPEEDUP = 300, 5.0, 4.0
COLUMNS = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms")


def speed_trace(requests: int) -> Any:
    return bench.synthetic_trace(requests, rate=requests / 300.0, prefix_groups=8, prefix_blocks=16,
                                 user_blocks=8, output_length=200, seed=1)  # fmt: skip


def fidelity_trace() -> Any:
    return bench.synthetic_trace(FIDELITY_REQUESTS, rate=FIDELITY_RATE, prefix_groups=4, prefix_blocks=12,
                                 user_blocks=4, output_length=100, seed=2)  # fmt: skip


def speed(requests: int) -> dict[str, Any]:
    trace = speed_trace(requests)
    replay(speed_trace(50), Fleet(workers=2))  # imports and first calls out of the timing
    rows = {}
    for name, fleet in SPEED_FLEETS.items():
        result = min((replay(trace, fleet) for _ in range(3)), key=lambda r: r.wall_s)
        rows[name] = {
            "requests": len(trace),
            "virtual_s": round(result.virtual_s, 1),
            "wall_s": round(result.wall_s, 3),
            "virtual_per_wall": round(result.speed, 1),
            "steps": result.steps,
            "meets_target": bool(len(trace) >= 1000 and result.virtual_s >= 295 and result.wall_s <= 2.0),
        }
    return rows


async def live_run(fleet: Fleet, trace: Any) -> Any:
    """The trace through a frontend and mocker workers like ``fleet``, compressed ``SPEEDUP`` times."""
    settings = MockerSettings().scaled(SPEEDUP)
    async with await LocalServices.start() as services:
        bus = ["--discovery", services.etcd_url, "--nats-url", services.nats_url, "--log-level", "WARNING"]
        engine = [*settings.argv(), "--context-length", "8192"]
        if fleet.disaggregated:
            await launch("components/mocker_worker.py", *bus, *engine, "--mode", "prefill",
                         "--num-workers", fleet.prefill, show_logs=False)  # fmt: skip
            await launch("components/mocker_worker.py", *bus, *engine, "--mode", "decode",
                         "--num-workers", fleet.decode, show_logs=False)  # fmt: skip
        else:
            await launch("components/mocker_worker.py", *bus, *engine, "--num-workers", fleet.workers,
                         show_logs=False)  # fmt: skip
        frontend = await launch("components/frontend.py", *bus, "--http-port", 0, "--router-mode", fleet.router,
                                show_logs=False)  # fmt: skip
        await bench.wait_for_model(frontend.url, "tiny-llama", instances=fleet.decode or fleet.workers)
        if fleet.disaggregated:
            await asyncio.sleep(1.0)  # the prefill workers' cards reach the frontend's planner
        return await bench.run_trace(frontend.url, "tiny-llama", trace, speedup=SPEEDUP, progress=False)


async def fidelity() -> dict[str, Any]:
    trace = fidelity_trace()
    rows = {}
    for name, fleet in {"aggregated 2 workers": Fleet(workers=2),
                        "disaggregated 1+1": Fleet(prefill=1, decode=1)}.items():  # fmt: skip
        offline = replay(trace, fleet).requests
        live = await live_run(fleet, trace)
        off, on = bench.summary(offline).iloc[0], bench.summary(live).iloc[0]
        row: dict[str, Any] = {"requests": len(trace), "live_errors": int(live["error"].notna().sum())}
        for column in COLUMNS:
            row[f"offline_{column}"] = round(float(off[column]), 2)
            row[f"live_{column}"] = round(float(on[column]), 2)
            row[f"gap_{column}"] = round(float(on[column] - off[column]), 2)
            row[f"ratio_{column}"] = round(float(on[column] / off[column]), 3)
        row["offline_cached_tokens"] = int(offline["cached_tokens"].sum())
        row["live_cached_tokens"] = int(live["cached_tokens"].fillna(0).sum())
        rows[name] = row
    return rows


async def main(requests: int) -> dict[str, Any]:
    return {
        "config": {
            "speed_requests": requests,
            "fidelity_requests": FIDELITY_REQUESTS,
            "fidelity_rate": FIDELITY_RATE,
            "live_speedup": SPEEDUP,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "speed": speed(requests),
        "fidelity": await fidelity(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{'offline replay':28} {'requests':>8} {'virtual s':>10} {'wall s':>8} {'virtual/wall':>13} {'target':>7}"
    )
    for name, row in result["speed"].items():
        print(f"{name:28} {row['requests']:>8} {row['virtual_s']:>10.1f} {row['wall_s']:>8.3f} "
              f"{row['virtual_per_wall']:>12.0f}× {'met' if row['meets_target'] else 'missed':>7}")  # fmt: skip
    print()
    print(f"{'offline vs live (ms)':28} {'metric':>12} {'offline':>9} {'live':>9} {'gap':>8} {'ratio':>7}")
    for name, row in result["fidelity"].items():
        for column in COLUMNS:
            print(f"{name:28} {column:>12} {row['offline_' + column]:>9.2f} {row['live_' + column]:>9.2f} "
                  f"{row['gap_' + column]:>8.2f} {row['ratio_' + column]:>7.3f}")  # fmt: skip
        print(f"{'':28} {'cached tok':>12} {row['offline_cached_tokens']:>9} {row['live_cached_tokens']:>9}")


if __name__ == "__main__":
    run_benchmark(
        __doc__, "replay", main, print_table, requests=1000, requests_help="requests in the speed trace"
    )
