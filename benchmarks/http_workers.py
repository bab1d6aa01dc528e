"""Does ``--http-workers 2`` give the frontend a second core's worth of capacity? Measured on this
2-core machine by CPU affinity, in one run.

Two frontends serve the same echo worker over one etcd, both up at once (an idle one costs
nothing): one process pinned to core 0 (``--http-workers 1``), and two processes on one port
(``--http-workers 2``, ``SO_REUSEPORT``) pinned to cores 0 and 1. The load generator (this
process), the echo worker and etcd are pinned to core 1 in both, so the first frontend has one
core of its own and the second has that core and a share of the other. Interleaved rounds, the
order swapped every round; medians over the rounds.

Two loads, closed loop at concurrency 64, streamed chat requests:

- **long prompts, one token**: a 400-word user message (~800 tokens) answered with one token. The frontend's
  work (JSON, the chat template, tokenizing 800 tokens) dwarfs the client's and the worker's, so
  the frontend is what saturates: this is where a second process can show.
- **short prompts, 32 tokens**: the usual 32-token streams. The client reads every token's event in
  Python on core 1 beside the worker, so core 1 saturates too and a second frontend process can
  add only what core 1 has left: the ceiling of this machine, not of the frontend.

Per load and frontend: requests/s, the frontend's CPU per request (every thread of every one of
its processes, ``/proc/PID/task/*/schedstat``) and the ratio of the two frontends' requests/s.

    pip install -e ".[bench]"   # psutil; wrk (Debian: apt install wrk) is used when on PATH
    python benchmarks/http_workers.py [--requests 3000] [--rounds 3] [--client wrk|python]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from _harness import RESULTS, machine
from frontend_ab import cpu_ns
from frontend_overhead import (
    MESSAGES,
    echo_stack,
    start_echo_frontend,
    stream_body,
    stream_tokens,
    throughput,
)

from dynamo_nb import ManagedProcess, bench

CONCURRENCY = 64
FRONTEND_ONE = {0}  # the one-process frontend's core
FRONTEND_TWO = {0, 1}  # the two-process frontend's cores
REST = {1}  # the load generator, the worker and etcd
LONG_PROMPT = list(bench.random_prompts(1, words=400, seed=5)[0].messages)
WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = io.open({body}, "rb")
local template = file:read("*a")
file:close()
local number = 0
request = function()
  number = number + 1
  local body = string.gsub(template, "REQUEST_NUMBER", tostring(number))
  return wrk.format(nil, nil, nil, body)
end
"""  # each request's message numbered, as frontend_overhead.numbered does: none is seen twice
LOADS = {"long prompts, one token": (LONG_PROMPT, 1), "short prompts, 32 tokens": (MESSAGES, 32)}


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def pin_tree(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and of the processes below it on ``cores`` (their later threads too)."""
    for process in tree(pid):
        for task in Path(f"/proc/{process}/task").iterdir():
            os.sched_setaffinity(int(task.name), cores)


def core_times() -> dict[int, tuple[int, int]]:
    """Per core: (busy, all) clock ticks so far, from ``/proc/stat``."""
    times = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(field) for field in fields]
            idle = ticks[3] + ticks[4]  # idle, iowait
            times[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return times


def busy_shares(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> list[float]:
    """Each core's busy share between two `core_times` readings."""
    return [
        round((after[core][0] - before[core][0]) / max(after[core][1] - before[core][1], 1), 2)
        for core in sorted(after)
    ]


def tree_cpu_ns(pid: int) -> int:
    """CPU time so far of every thread of ``pid`` and of the processes below it, in nanoseconds."""
    return sum(cpu_ns(process) for process in tree(pid))


async def python_client(
    http: aiohttp.ClientSession, url: str, messages: Any, tokens: int, requests: int
) -> tuple[float, int]:
    """``requests`` requests at `CONCURRENCY` from this process: (requests/s, requests)."""
    call = functools.partial(stream_tokens, http, url, tokens, messages)
    return await throughput(call, CONCURRENCY, requests), requests


async def wrk_client(url: str, messages: Any, tokens: int, seconds: float) -> tuple[float, int]:
    """wrk (one thread, on core 1 as this process) for ``seconds``: (requests/s, requests); its CPU
    shows in this process's children's usage once it is reaped."""
    body = stream_body(tokens, messages)
    body["messages"][-1]["content"] = f"{messages[-1]['content']} (REQUEST_NUMBER)"
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "body.json").write_text(json.dumps(body))
        script = Path(folder) / "post.lua"
        script.write_text(WRK_SCRIPT.format(body=json.dumps(str(Path(folder) / "body.json"))))
        done = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{CONCURRENCY}", f"-d{seconds:g}s", "-s", str(script), f"{url}/v1/chat/completions",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said = (await asyncio.wait_for(done.communicate(), seconds + 60))[0].decode()
    answered = re.search(r"(\d+) requests in", said)
    failed = re.search(
        r"Non-2xx or 3xx responses: (\d+)|Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
        said,
    )
    if done.returncode != 0 or answered is None or (failed and any(int(n) for n in failed.groups() if n)):
        raise RuntimeError(f"wrk failed or saw errors: {said}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", said)
    return float(rate.group(1)) if rate else 0.0, int(answered.group(1))


async def measured(
    http: aiohttp.ClientSession,
    frontend: ManagedProcess,
    worker: ManagedProcess,
    url: str,
    messages: Any,
    tokens: int,
    requests: int,
    client: str,
) -> dict[str, Any]:
    """A load of ``requests`` requests (the Python client) or as many as wrk sends in the time the
    Python client would take at 2000 req/s: requests/s, the frontend's CPU µs per request, the
    client's and the worker's (what shares core 1), and each core's busy share."""
    if client == "wrk":
        await wrk_client(url, messages, tokens, 1)  # warm: every connection open, caches full
    else:
        await python_client(http, url, messages, tokens, CONCURRENCY * 2)
    before, cores = (tree_cpu_ns(frontend.pid), client_cpu_ns(), tree_cpu_ns(worker.pid)), core_times()
    if client == "wrk":
        rate, answered = await wrk_client(url, messages, tokens, max(requests / 2000, 2))
    else:
        rate, answered = await python_client(http, url, messages, tokens, requests)
    after, busy = (tree_cpu_ns(frontend.pid), client_cpu_ns(), tree_cpu_ns(worker.pid)), core_times()
    used = [(b - a) / 1000 / answered for a, b in zip(before, after, strict=True)]
    return {"req_per_s": rate, "frontend_cpu_us_per_request": used[0], "client_cpu_us_per_request": used[1],
            "worker_cpu_us_per_request": used[2], "busy": busy_shares(cores, busy)}  # fmt: skip


def client_cpu_ns() -> int:
    """This process's CPU and its reaped children's (the load generator, either kind: wrk's shows
    once it exits), in nanoseconds."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time_ns() + int((children.ru_utime + children.ru_stime) * 1e9)


async def main(requests: int, rounds: int, client: str) -> dict[str, Any]:
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("this benchmark pins processes to cores 0 and 1: it needs two cores")
    os.sched_setaffinity(0, REST)
    frontends: dict[str, tuple[ManagedProcess, str]] = {}
    async with echo_stack() as stack:
        for name, workers, cores in (
            ("1 process, 1 core", 1, FRONTEND_ONE),
            ("2 processes, 2 cores", 2, FRONTEND_TWO),
        ):
            frontend, url = await start_echo_frontend(stack.http, stack.etcd, "--http-workers", str(workers))
            stack.programs.append(frontend)
            pin_tree(frontend.pid, cores)
            frontends[name] = (frontend, url)
        for pid in psutil.Process().children(recursive=True):
            if not any(pid.pid in tree(frontend.pid) for frontend, _ in frontends.values()):
                pin_tree(pid.pid, REST)  # the worker, etcd
        processes = {name: len(tree(frontend.pid)) for name, (frontend, _) in frontends.items()}
        found: dict[str, dict[str, list[dict[str, float]]]] = {
            load: {n: [] for n in frontends} for load in LOADS
        }
        echo = stack.programs[0]
        for turn in range(rounds):
            order = list(frontends) if turn % 2 == 0 else list(reversed(frontends))
            for load, (messages, tokens) in LOADS.items():
                for name in order:
                    frontend, url = frontends[name]
                    found[load][name].append(
                        await measured(stack.http, frontend, echo, url, messages, tokens, requests, client)
                    )
    table = []
    one, two = list(frontends)
    for load, by_frontend in found.items():
        row: dict[str, Any] = {"load": load}
        for name, runs in by_frontend.items():
            row[name] = {
                key: statistics.median(run[key] for run in runs) for key in runs[0] if key != "busy"
            } | {
                "req_per_s_runs": [round(run["req_per_s"], 1) for run in runs],
                "busy": [run["busy"] for run in runs],
            }
        row["capacity_ratio"] = row[two]["req_per_s"] / row[one]["req_per_s"]
        pairs = zip(by_frontend[two], by_frontend[one], strict=True)  # the same round's two runs
        row["capacity_ratio_runs"] = [round(b["req_per_s"] / a["req_per_s"], 2) for b, a in pairs]
        # what two cores allow at most, given the CPU each request took of every process
        per_request = sum(row[two][f"{part}_cpu_us_per_request"] for part in ("frontend", "client", "worker"))
        row["two_cores_bound_req_per_s"] = 2e6 / per_request
        row["ratio_bound"] = row["two_cores_bound_req_per_s"] / row[one]["req_per_s"]
        table.append(row)
    return {
        "benchmark": "http_workers",
        "machine": machine(),
        "setup": f"echo worker and frontend processes (etcd, TCP request plane), streamed chat requests at "
        f"concurrency {CONCURRENCY}; frontends pinned to cores {sorted(FRONTEND_ONE)} and {sorted(FRONTEND_TWO)}, "
        f"the load generator ({client}), the worker and etcd to {sorted(REST)}; {rounds} interleaved rounds, medians",
        "client": client,
        "processes": processes,
        "requests_per_round": requests,
        "loads": table,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['setup']}\n")
    names = [key for key in result["loads"][0] if isinstance(result["loads"][0][key], dict)]
    print(
        f"{'load':<26}"
        + "".join(f"{name + ' req/s':>28}{'CPU µs/req':>12}" for name in names)
        + f"{'ratio':>8}"
    )
    for row in result["loads"]:
        cells = "".join(
            f"{row[n]['req_per_s']:>28.1f}{row[n]['frontend_cpu_us_per_request']:>12.0f}" for n in names
        )
        runs = ", ".join(f"{ratio:.2f}" for ratio in row["capacity_ratio_runs"])
        print(f"{row['load']:<26}{cells}{row['capacity_ratio']:>8.2f}{row['ratio_bound']:>8.2f}  {runs}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="requests per load, frontend and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument(
        "--client", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python",
        help="the load generator: wrk (C, cheap per request; default when on PATH) or this process (aiohttp)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS / "http_workers.json")
    args = parser.parse_args()
    started = time.perf_counter()
    report = asyncio.run(main(args.requests, args.rounds, args.client))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"\nwrote {args.out} ({time.perf_counter() - started:.0f} s)")
