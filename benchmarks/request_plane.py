"""Request-plane round trip: each plane next to a raw baseline measured in the same run.

A sequential round trip is one small request and one small reply item (then the end of the
stream). The server side runs in a separate process for tcp and nats:

    plane   ours                                     baseline (same run)
    inproc  client → handler in this process         iterating the handler directly
    tcp     etcd discovery, TCP plane, subprocess    raw asyncio TCP echo, subprocess
    nats    etcd discovery, NATS plane, subprocess   raw nats-py request/reply, subprocess

Also measured: how long after ``context.stop_generating()`` a streaming request ends
(the stop crosses the wire, the handler sees it, the end comes back).

    python benchmarks/request_plane.py [--requests 3000] [--out benchmarks/results/request_plane.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import nats

from dynamo_nb import Context, DistributedRuntime, LocalServices

HERE = Path(__file__).resolve().parent
ECHO_SUBJECT = "bench.raw.echo"
PAYLOAD = b"0123456789abcdef"
REQUEST = {"x": 1}
TARGETS = {"tcp": ("ratio", 2.0), "nats": ("ratio", 1.3), "inproc": ("p50_us", 50.0)}


async def one_item(request: Any, context: Context) -> Any:
    yield {"y": 1}


async def ticker(request: Any, context: Context) -> Any:
    """Streams every millisecond until stopped, then says so."""
    i = 0
    while not context.is_stopped():
        yield {"i": i}
        i += 1
        await asyncio.sleep(0.001)
    yield {"stopped": True}


# ----------------------------------------------------------------------------- server process


async def serve(etcd_url: str, nats_url: str) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                writer.write(await reader.readexactly(len(PAYLOAD)))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    raw_tcp = await asyncio.start_server(echo, "127.0.0.1", 0)
    nc = await nats.connect(nats_url)

    async def respond(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(ECHO_SUBJECT, cb=respond)
    runtimes = []
    for plane in ("tcp", "nats"):
        rt = await DistributedRuntime.create(etcd_url, plane, nats_url)
        await rt.endpoint(f"bench.{plane}.generate").serve(one_item)
        await rt.endpoint(f"bench.{plane}.ticker").serve(ticker)
        runtimes.append(rt)
    port = raw_tcp.sockets[0].getsockname()[1]
    print(json.dumps({"ready": True, "tcp_port": port}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    for rt in runtimes:
        await rt.shutdown(grace=0.5)
    await nc.close()


# ----------------------------------------------------------------------------- measurements


def summarize(samples_ns: list[int]) -> tuple[float, float]:
    samples = sorted(samples_ns)
    p50 = statistics.median(samples) / 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000
    return p50, p99


async def time_calls(call: Any, n: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        await call()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(n):
        start = clock()
        await call()
        samples.append(clock() - start)
    return samples


async def stream_once(client: Any) -> None:
    async for _ in client.round_robin(REQUEST):
        pass


async def stop_latency_ms(client: Any, n: int) -> float:
    """Median ms from `stop_generating()` to the end of the stream."""
    samples = []
    for _ in range(n):
        context = Context()
        stopped_at = 0.0
        async for item in client.round_robin({}, context=context):
            if item.get("i") == 3:
                stopped_at = time.perf_counter()
                context.stop_generating()
        samples.append((time.perf_counter() - stopped_at) * 1000)
    return statistics.median(samples)


async def bench_inproc(n: int, warmup: int) -> dict[str, Any]:
    async with await DistributedRuntime.create() as rt:
        endpoint = rt.endpoint("bench.inproc.generate")
        await endpoint.serve(one_item)
        await rt.endpoint("bench.inproc.ticker").serve(ticker)
        client = await endpoint.client()
        await client.wait_for_instances(timeout=10)
        context = Context()

        async def direct() -> None:
            async for _ in one_item(REQUEST, context):
                pass

        baseline = await time_calls(direct, n, warmup)
        ours = await time_calls(lambda: stream_once(client), n, warmup)
        ticker_client = await rt.endpoint("bench.inproc.ticker").client()
        stop_ms = await stop_latency_ms(ticker_client, 20)
    return result(ours, baseline, "handler iterated directly, same process", stop_ms)


def result(ours: list[int], baseline: list[int], baseline_name: str, stop_ms: float) -> dict[str, Any]:
    p50, p99 = summarize(ours)
    b50, b99 = summarize(baseline)
    return {
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "baseline_p50_us": round(b50, 1),
        "baseline_p99_us": round(b99, 1),
        "ratio": round(p50 / b50, 2),
        "baseline": baseline_name,
        "stop_to_end_p50_ms": round(stop_ms, 2),
        "requests": len(ours),
    }


async def bench_remote(
    plane: str, services: LocalServices, tcp_port: int, n: int, warmup: int
) -> dict[str, Any]:
    async with await DistributedRuntime.create(str(services.etcd_url), plane, services.nats_url) as rt:
        client = await rt.endpoint(f"bench.{plane}.generate").client()
        await client.wait_for_instances(timeout=30)
        if plane == "tcp":
            reader, writer = await asyncio.open_connection("127.0.0.1", tcp_port)

            async def raw() -> None:
                writer.write(PAYLOAD)
                await reader.readexactly(len(PAYLOAD))

            name = "raw asyncio TCP echo across processes"
        else:
            nc = await nats.connect(str(services.nats_url))

            async def raw() -> None:
                await nc.request(ECHO_SUBJECT, PAYLOAD, timeout=5)

            name = "raw nats-py request/reply across processes"
        # alternate baseline and ours in rounds so drift on the machine hits both alike
        baseline: list[int] = []
        ours: list[int] = []
        rounds = 5
        for _ in range(rounds):
            baseline += await time_calls(raw, n // rounds, warmup // rounds)
            ours += await time_calls(lambda: stream_once(client), n // rounds, warmup // rounds)
        if plane == "tcp":
            writer.close()
        else:
            await nc.close()
        ticker_client = await rt.endpoint(f"bench.{plane}.ticker").client()
        await ticker_client.wait_for_instances(timeout=30)
        stop_ms = await stop_latency_ms(ticker_client, 20)
    return result(ours, baseline, name, stop_ms)


def verdict(plane: str, row: dict[str, Any]) -> str:
    key, limit = TARGETS[plane]
    return f"{'meets' if row[key] <= limit else 'MISSES'} {key} ≤ {limit:g}"


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=3000, help="timed round trips per plane (default: %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=300, help="untimed round trips first (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "request_plane.json")
    parser.add_argument("--serve", nargs=2, metavar=("ETCD_URL", "NATS_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        await serve(*args.serve)
        return 0

    results: dict[str, Any] = {"inproc": await bench_inproc(args.requests, args.warmup)}
    async with await LocalServices.start() as services:
        server = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--serve", str(services.etcd_url), str(services.nats_url),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert server.stdout is not None and server.stdin is not None
            ready = json.loads(await asyncio.wait_for(server.stdout.readline(), 60))
            for plane in ("tcp", "nats"):
                results[plane] = await bench_remote(
                    plane, services, ready["tcp_port"], args.requests, args.warmup
                )
        finally:
            if server.stdin is not None:
                server.stdin.close()
            try:
                await asyncio.wait_for(server.wait(), 15)
            except asyncio.TimeoutError:
                server.kill()

    print(f"\nsequential round trip, {args.requests} requests per plane (µs; ratio = p50 / baseline p50)\n")
    print(
        f"{'plane':<7} {'p50':>8} {'p99':>8} {'base p50':>9} {'base p99':>9} {'ratio':>6} {'stop→end':>9}  target"
    )
    for plane in ("inproc", "tcp", "nats"):
        r = results[plane]
        print(
            f"{plane:<7} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['baseline_p50_us']:>9.1f} "
            f"{r['baseline_p99_us']:>9.1f} {r['ratio']:>6.2f} {r['stop_to_end_p50_ms']:>7.2f}ms  {verdict(plane, r)}"
        )
    print("\nbaselines: " + "; ".join(f"{p}: {results[p]['baseline']}" for p in results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
