"""The three serving paths across hosts, at 0, 1 and 5 ms one-way delay: the round trips the
disaggregated fast path saves, which loopback hides.

Hosts are network namespaces on one switch (`dynamo_nb.testing.hosts`; needs root): etcd on
``svc``, the frontend on ``fe``, each worker of ``disagg.py``'s graph on a host of its own (an
aggregated worker; a decode worker; a prefill worker that publishes its bootstrap server, so
the frontend takes the **fast** path, and one that does not, the **fallback** path), the
client on ``cl``. The same processes serve every level; the switch is reshaped between levels.

Why the paths differ by round trips: on the fallback path the frontend sends the decode
request only once the prefill's first item (its ``disaggregated_params``) is back, so the
prefill's round trip from the frontend, and then the decode's connection to the prefill's
bootstrap server, come one after the other. On the fast path the frontend sends both requests
at once: the decode connects to the bootstrap server and waits there while the prefill runs.
So the fallback's TTFT minus the fast path's should grow by at least one round trip (2 × the
one-way delay) per millisecond of delay; the report gives the measured growth in round trips.

    sudo python benchmarks/disagg_hosts.py [--requests 30] [--out benchmarks/results/disagg_hosts.json]
"""

from __future__ import annotations

from typing import Any

from _harness import machine, run_benchmark
from disagg import PATHS, TOKENS, by_path, measure, start_graph

from dynamo_nb.testing.hosts import HostNetwork, netns_unavailable

DELAYS_MS = (0.0, 1.0, 5.0)
HOSTS = {"aggregated": "agg", "decode": "dec", "fast prefill": "pfast", "fallback prefill": "pfall"}


async def main(requests: int) -> dict[str, Any]:
    reason = netns_unavailable()
    if reason is not None:
        raise SystemExit(f"this benchmark makes hosts in network namespaces: {reason}")
    net = await HostNetwork.start(["svc", "fe", *HOSTS.values(), "cl"])
    levels: dict[str, Any] = {}
    try:
        services = await net["svc"].services(nats=False)
        with net["cl"].entered():  # this process's connections (the client's) start on host cl
            url = await start_graph(
                str(services.etcd_url),
                start=lambda role: net[HOSTS.get(role, "fe")].launch,
                http_host=net["fe"].address,
            )
            for delay in DELAYS_MS:
                await net.shape(delay_ms=delay)
                df = await measure(url, requests)
                levels[f"{delay:g}"] = row = by_path(df)
                ttfts = ", ".join(f"{p} {row[p]['ttft_p50_ms']:.1f}" for p in PATHS)
                print(f"one-way delay {delay:g} ms: TTFT p50 (ms) {ttfts}", flush=True)
    finally:
        await net.stop()
    report: dict[str, Any] = {"one_way_delay_ms": levels}
    advantage = {d: row["fallback"]["ttft_p50_ms"] - row["fast"]["ttft_p50_ms"] for d, row in levels.items()}
    report["fast_advantage_ttft_p50_ms"] = advantage
    low, high = f"{DELAYS_MS[1]:g}", f"{DELAYS_MS[2]:g}"
    growth = (advantage[high] - advantage[low]) / (2 * (DELAYS_MS[2] - DELAYS_MS[1]))
    report["advantage_growth_in_round_trips"] = growth
    report["grows_by_at_least_one_round_trip"] = growth >= 1.0
    report["setup"] = {
        "machine": machine(),
        "hosts": "etcd, frontend, four hf workers and the client, each in a network namespace of its own",
        "prompt_words": 200,
        "tokens_per_request": TOKENS,
        "requests_per_level": {"aggregated": requests, "disaggregated": 2 * requests},
        "note": "one request at a time; the switch delays every frame by the level's one-way delay "
        "(to within about a millisecond: it runs in user space)",
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    print(f"\nTiny model across hosts, {TOKENS}-token greedy requests one at a time: TTFT p50 / p99 (ms)")
    print(f"{'one-way delay':<15}" + "".join(f"{path:>22}" for path in PATHS) + f"{'fallback - fast':>18}")
    for delay, row in report["one_way_delay_ms"].items():
        cells = "".join(f"{row[p]['ttft_p50_ms']:>13.1f} / {row[p]['ttft_p99_ms']:>6.1f}" for p in PATHS)
        print(f"{delay + ' ms':<15}{cells}{report['fast_advantage_ttft_p50_ms'][delay]:>18.1f}")
    growth = report["advantage_growth_in_round_trips"]
    verdict = "at least" if report["grows_by_at_least_one_round_trip"] else "LESS than"
    print(
        f"the fast path's advantage grows by {growth:.2f} round trips per round trip of delay ({verdict} one)"
    )


if __name__ == "__main__":
    run_benchmark(
        __doc__, "disagg_hosts", main, print_table, requests=30, requests_help="rounds per delay level"
    )
