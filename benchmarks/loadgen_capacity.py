"""Is the load generator ever the bottleneck? Its capacity against a zero-cost server.

A stub OpenAI server (`dynamo_nb.testing.stub_server`, its own process: every answer is one
precomputed write) answers streamed 32-token chat requests. In the same run, at each
concurrency, this process drives it two ways:

- ``bench.run``: the real load generator (its own HTTP/1.1 client, ``http.lean_client``, SSE
  parsing, a record per request with TTFT, every inter-token gap, usage and worker ids);
- baseline 1, aiohttp alone: aiohttp's client posting the same bodies and reading each whole
  answer, with no SSE parsing and no records (what `bench.run` used before its own client);
- baseline 2, a bare client: raw asyncio streams, keep-alive, read to the end of the chunked
  body (about the most a Python client gets from this server).

It reports requests/s and output tokens/s, the ratios of bench to both baselines, and bench's
CPU time per request in this process. The target is at least 1000 requests/s from one process.

    python benchmarks/loadgen_capacity.py [--requests 4000] [--out benchmarks/results/loadgen_capacity.json]
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from _harness import machine, run_benchmark

from dynamo_nb import bench, launch

TOKENS = 32
TARGET_RPS = 1000
CONCURRENCY = (32, 64, 128)
PROMPTS = bench.random_prompts(100, words=32)


async def baseline(url: str, concurrency: int, total: int) -> float:
    """Requests/s of a bare keep-alive client that reads each answer to its end, nothing more."""
    address = urlsplit(url)
    payload = json.dumps(
        {
            "model": "stub",
            "messages": list(PROMPTS[0].messages),
            "max_tokens": TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    remaining = total

    async def client() -> None:
        nonlocal remaining
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            while remaining > 0:
                remaining -= 1
                writer.write(request)
                await reader.readuntil(b"\r\n0\r\n\r\n")  # the end of the chunked body
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return total / (time.perf_counter() - started)


async def aiohttp_alone(url: str, concurrency: int, total: int) -> float:
    """Requests/s of aiohttp posting the bench's bodies and reading whole answers (no parsing)."""
    import aiohttp

    payload = json.dumps(
        {"model": "stub", "messages": list(PROMPTS[0].messages), "max_tokens": TOKENS, "stream": True}
    ).encode()
    remaining = total
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                async with session.post(url + "/v1/chat/completions", data=payload) as response:
                    await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def with_bench(url: str, concurrency: int, total: int) -> dict[str, Any]:
    cpu, started = time.process_time(), time.perf_counter()
    df = await bench.run(
        url,
        "stub",
        prompts=PROMPTS,
        concurrency=concurrency,
        requests=total,
        max_tokens=TOKENS,
        progress=False,
    )
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    errors = int(df["error"].notna().sum())
    complete = int((df["output_tokens"] == TOKENS).sum()) == total and all(
        len(g) == TOKENS - 1 for g in df["itl_s"]
    )
    return {
        "rps": total / wall,
        "output_tok_per_s": total * TOKENS / wall,
        "cpu_ms_per_request": cpu / total * 1e3,
        "errors": errors,
        "every_token_recorded": complete,
    }


async def main(requests: int) -> dict[str, Any]:
    stub = await launch("-m", "dynamo_nb.testing.stub_server", show_logs=False)
    rows = []
    try:
        await bench.run(
            stub.url, "stub", concurrency=8, requests=200, max_tokens=TOKENS, progress=False
        )  # warm-up
        for concurrency in CONCURRENCY:
            await baseline(stub.url, concurrency, 200)
            base_rps = await baseline(stub.url, concurrency, requests)
            aiohttp_rps = await aiohttp_alone(stub.url, concurrency, requests)
            server_cpu = stub.cpu_seconds()
            measured = await with_bench(stub.url, concurrency, requests)
            server_ms = (stub.cpu_seconds() - server_cpu) / requests * 1e3
            rows.append(
                {
                    "concurrency": concurrency,
                    "requests": requests,
                    "bench_rps": measured["rps"],
                    "bench_output_tok_per_s": measured["output_tok_per_s"],
                    "bench_cpu_ms_per_request": measured["cpu_ms_per_request"],
                    "aiohttp_alone_rps": aiohttp_rps,
                    "ratio_bench_to_aiohttp_alone": measured["rps"] / aiohttp_rps,
                    "bare_client_rps": base_rps,
                    "ratio_bench_to_bare_client": measured["rps"] / base_rps,
                    "stub_cpu_ms_per_request": server_ms,
                    "errors": measured["errors"],
                    "every_token_recorded": measured["every_token_recorded"],
                }
            )
    finally:
        await stub.stop()
    best = max(row["bench_rps"] for row in rows)
    return {
        "rows": rows,
        "best_bench_rps": best,
        "target_rps": TARGET_RPS,
        "meets_target": best >= TARGET_RPS,
        "setup": {
            "machine": machine(),
            "tokens_per_stream": TOKENS,
            "note": "the load generator (this process) and the stub server (another) share the machine",
        },
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"\nStreamed {TOKENS}-token chat requests against a zero-cost stub server (requests/s)")
    print(
        f"{'concurrency':>11}{'bench.run':>11}{'aiohttp alone':>15}{'ratio':>7}{'bare client':>13}{'ratio':>7}"
        f"{'bench CPU ms/req':>18}{'bench tok/s':>13}"
    )
    for row in report["rows"]:
        print(
            f"{row['concurrency']:>11}{row['bench_rps']:>11.0f}{row['aiohttp_alone_rps']:>15.0f}"
            f"{row['ratio_bench_to_aiohttp_alone']:>7.2f}{row['bare_client_rps']:>13.0f}"
            f"{row['ratio_bench_to_bare_client']:>7.2f}{row['bench_cpu_ms_per_request']:>18.3f}"
            f"{row['bench_output_tok_per_s']:>13.0f}"
        )
    verdict = "meets" if report["meets_target"] else "MISSES"
    print(f"best {report['best_bench_rps']:.0f} req/s: {verdict} the {report['target_rps']} req/s target")


if __name__ == "__main__":
    run_benchmark(
        __doc__, "loadgen_capacity", main, print_table, requests=4000, requests_help="requests per level"
    )
