"""What the kit costs in front of a running server: the same server asked directly, and through
the kit's frontend and an upstream worker (`dynamo_nb.engines.UpstreamEngine`), in one run.

The server is ``python -m dynamo_nb run --in http --out mocker`` (an OpenAI-compatible server
whose engine is simulated), twice: model-paced (``--speedup-ratio 1``: each step takes the time
Dynamo's timing model gives a GPU, as a real server's steps take the model's time) and ten
times faster (``--speedup-ratio 10``: the steps nearly free, so the hop's own CPU shows). The kit is ``python -m dynamo_nb run --in
http --out upstream=URL``: its frontend and the upstream worker in one process, the worker
asking the server over HTTP with token ids. The same load generator (`dynamo_nb.bench`, this
process) asks each in turn at every concurrency level (1, 8, 32), 32-token streams, a kept-alive
connection per client: TTFT and ITL p50/p90 and requests/s per level, and the differences (TTFT
through − direct) and ratios (requests/s through / direct). This machine runs the client, the
server and the kit together: the kit's process takes CPU from the server it measures.

    python benchmarks/upstream.py [--requests 480]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from _harness import fresh_prompts, level_figures, machine, run_benchmark

from dynamo_nb import bench, launch
from dynamo_nb.runtime.addresses import free_port

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 32)
TOKENS = 32
MODEL = "tiny-llama"
SERVERS = {  # the mocker's --speedup-ratio → what that server is like
    "1": "model-paced: steps take a GPU's time (Dynamo's timing model), as a real server's do",
    "10": "ten times faster: the server's steps nearly free, so the hop's own CPU shows",
}


async def start(*out: str, name: str) -> tuple[Any, str]:
    port = free_port()
    process = await launch(sys.executable, "-m", "dynamo_nb", "run", "--in", "http", *out, "--http-port", port,
                           "--log-level", "WARNING", cwd=ROOT, show_logs=False, timeout=180, name=name)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, MODEL, timeout=120)
    return process, url


async def measure(url: str, level: int, requests: int) -> dict[str, Any]:
    return await level_figures(
        url, MODEL, level, requests, prompts=fresh_prompts(requests), max_tokens=TOKENS, ignore_eos=True
    )


async def compare(speedup: str, requests: int) -> list[dict[str, Any]]:
    """One server (the mocker at ``speedup``) asked directly and through the kit, level by level."""
    server, direct = await start("--out", "mocker", "--speedup-ratio", speedup, name="server")
    kit, through = await start("--out", f"upstream={direct}", name="kit")
    rows = []
    try:
        for url in (direct, through):
            await measure(url, 8, 32)  # warm-up: connections, tokenizer caches
        for level in LEVELS:
            count = max(requests if level > 1 else requests // 3, 2 * level)
            measured = {
                "direct": await measure(direct, level, count),
                "through": await measure(through, level, count),
            }
            a, b = measured["direct"], measured["through"]
            rows.append({
                "server": SERVERS[speedup], "speedup_ratio": float(speedup), "concurrency": level, **measured,
                "ttft_p50_added_ms": b["ttft_p50_ms"] - a["ttft_p50_ms"],
                "itl_p50_added_ms": b["itl_p50_ms"] - a["itl_p50_ms"],
                "ratio_req_per_s": b["req_per_s"] / a["req_per_s"],
            })  # fmt: skip
    finally:
        await kit.stop(timeout=30)
        await server.stop(timeout=30)
    return rows


async def main(requests: int) -> dict[str, Any]:
    rows = []
    for speedup in SERVERS:
        rows += await compare(speedup, requests)
    return {
        "benchmark": "upstream",
        "machine": machine(),
        "servers": {
            speedup: f"python -m dynamo_nb run --out mocker --speedup-ratio {speedup}: {what}"
            for speedup, what in SERVERS.items()
        },
        "kit": "python -m dynamo_nb run --out upstream=URL (frontend + upstream worker, one process)",
        "tokens": TOKENS,
        "requests": requests,
        "rows": rows,
        "note": "added = through - direct; ratio = through / direct (1.0: the hop costs nothing)",
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'speedup':>7} {'c':>3}  {'TTFT p50 direct':>15} {'through':>8} {'added':>7}  {'ITL p50 direct':>14} {'through':>8}"
          f"  {'req/s direct':>12} {'through':>8} {'ratio':>6}")  # fmt: skip
    for row in result["rows"]:
        a, b = row["direct"], row["through"]
        print(f"{row['speedup_ratio']:>7g} {row['concurrency']:>3}  {a['ttft_p50_ms']:>15.2f} {b['ttft_p50_ms']:>8.2f} {row['ttft_p50_added_ms']:>7.2f}"
              f"  {a['itl_p50_ms']:>14.2f} {b['itl_p50_ms']:>8.2f}  {a['req_per_s']:>12.1f} {b['req_per_s']:>8.1f}"
              f" {row['ratio_req_per_s']:>6.2f}")  # fmt: skip
    print(result["note"])


if __name__ == "__main__":
    run_benchmark(__doc__ or "", "upstream", main, print_table, requests=480,
                  requests_help="requests per stack at each level above 1 (a third at 1)")  # fmt: skip
