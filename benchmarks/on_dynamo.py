"""The same workers on the kit's runtime behind the kit's frontend, and on NVIDIA Dynamo's
runtime (``--runtime dynamo``) behind Dynamo's frontend, in one run.

Per worker kind (``mocker_worker.py`` at ``--speedup-ratio 10``, ``hf_worker.py``: the real tiny
model on the CPU), two stacks run side by side on this machine, each a worker process and a
frontend process over its own discovery folder:

- ``kit``: ``components/<worker>.py`` + ``components/frontend.py``;
- ``dynamo``: ``components/<worker>.py --runtime dynamo`` + ``python -m dynamo.frontend``.

The same load generator (`dynamo_nb.bench`, this process) drives them in turn, alternating the
stacks at every concurrency level (1, 8, 32), 32-token streams after a warm-up of both, a new
connection per request (Dynamo's HTTP server leaves Nagle's algorithm on: on a kept-alive
connection a small first chunk waits ~40 ms for the client's delayed ACK, which would measure
the socket option, not the stack): TTFT p50/p90 and requests/s per level, and the ratios
kit / dynamo. Needs Dynamo's packages in this
Python (``python3 -m dynamo_nb install dynamo``); without them it says so and exits 2.

    python benchmarks/on_dynamo.py [--requests 96]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from _harness import fresh_prompts, level_figures, machine, run_benchmark

from dynamo_nb import bench, launch
from dynamo_nb.extras import extra_installed
from dynamo_nb.on_dynamo import launch_dynamo_frontend
from dynamo_nb.runtime.addresses import free_port

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 32)
TOKENS = 32
MODEL = "tiny-llama"
WORKERS = {
    "mocker": ("components/mocker_worker.py", "--speedup-ratio", "10"),
    "hf": ("components/hf_worker.py",),
}


class Stack:
    """A worker and a frontend, on the kit's runtime or on Dynamo's."""

    def __init__(self, name: str, worker: tuple[str, ...], folder: Path) -> None:
        self.name, self.worker, self.discovery = name, worker, f"file://{folder}"
        self.processes: list[Any] = []
        self.url = ""

    async def start(self) -> None:
        runtime = ("--runtime", "dynamo") if self.name == "dynamo" else ()
        common = {"cwd": ROOT, "show_logs": False, "timeout": 180}
        worker = await launch(*self.worker, *runtime, "--discovery", self.discovery, "--log-level", "WARNING",
                              name=f"{self.name}-worker", **common)  # fmt: skip
        self.processes.append(worker)
        if self.name == "dynamo":
            frontend = await launch_dynamo_frontend(self.discovery, log="warn", **common)
            self.processes.append(frontend.process)
            self.url = frontend.url
        else:
            port = free_port()
            frontend = await launch("components/frontend.py", "--discovery", self.discovery, "--http-port",
                                    str(port), "--log-level", "WARNING", name="kit-frontend", **common)  # fmt: skip
            self.processes.append(frontend)
            self.url = f"http://127.0.0.1:{port}"
        await bench.wait_for_model(self.url, MODEL, timeout=120)

    async def measure(self, level: int, requests: int) -> dict[str, Any]:
        return await level_figures(self.url, MODEL, level, requests, prompts=fresh_prompts(requests), max_tokens=TOKENS,
                                   ignore_eos=True, new_connection=True)  # fmt: skip

    async def stop(self) -> None:
        for process in reversed(self.processes):
            await process.stop(timeout=30)


async def main(requests: int) -> dict[str, Any]:
    if not extra_installed("dynamo"):
        print("needs NVIDIA Dynamo's packages: python3 -m dynamo_nb install dynamo", file=sys.stderr)
        raise SystemExit(2)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for kind, worker in WORKERS.items():
            stacks = [Stack(name, worker, Path(scratch) / f"{kind}-{name}") for name in ("kit", "dynamo")]
            try:
                for stack in stacks:
                    await stack.start()
                    await stack.measure(8, 32)  # warm-up: tokenizer caches, connections
                for level in LEVELS:
                    count = max(requests if level > 1 else requests // 3, 2 * level)
                    measured = {stack.name: await stack.measure(level, count) for stack in stacks}
                    kit, dyn = measured["kit"], measured["dynamo"]
                    rows.append({
                        "worker": kind, "concurrency": level, "kit": kit, "dynamo": dyn,
                        "ratio_ttft_p50": kit["ttft_p50_ms"] / dyn["ttft_p50_ms"],
                        "ratio_req_per_s": kit["req_per_s"] / dyn["req_per_s"],
                    })  # fmt: skip
            finally:
                for stack in stacks:
                    await stack.stop()
    return {
        "benchmark": "on_dynamo",
        "machine": machine(),
        "dynamo": "ai-dynamo 1.6.1",
        "tokens": TOKENS,
        "requests": requests,
        "connections": "a new connection per request",
        "rows": rows,
        "note": "ratio = kit / dynamo: TTFT below 1 and requests/s above 1 favour the kit's stack",
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'worker':<7} {'c':>3}  {'TTFT p50 kit':>12} {'dynamo':>8}  {'p90 kit':>8} {'dynamo':>8}"
          f"  {'req/s kit':>9} {'dynamo':>8}  {'TTFT ratio':>10} {'req/s ratio':>11}")  # fmt: skip
    for row in result["rows"]:
        kit, dyn = row["kit"], row["dynamo"]
        print(f"{row['worker']:<7} {row['concurrency']:>3}  {kit['ttft_p50_ms']:>12.1f} {dyn['ttft_p50_ms']:>8.1f}"
              f"  {kit['ttft_p90_ms']:>8.1f} {dyn['ttft_p90_ms']:>8.1f}  {kit['req_per_s']:>9.1f} {dyn['req_per_s']:>8.1f}"
              f"  {row['ratio_ttft_p50']:>10.2f} {row['ratio_req_per_s']:>11.2f}")  # fmt: skip
    print(result["note"])


if __name__ == "__main__":
    run_benchmark(__doc__ or "", "on_dynamo", main, print_table, requests=96,
                  requests_help="requests per stack at each level above 1 (a third at 1)")  # fmt: skip
