"""Where a request's CPU goes in the frontend: each stage of the hot path, measured in the
frontend's own process while it serves a load, for 1-, 32- and 256-token streams.

An echo worker (the zero-cost engine: it streams the prompt's token ids back) and the frontend,
each its own process over etcd and the TCP request plane, and this client sending streamed chat
requests at concurrency 32. The frontend runs alone on one core; this client and the worker
share the others. The frontend runs with a CPU-time sampler inside (`_cpu_sampler.py`): at each
scheduler tick the kernel counts as the frontend's CPU, its Python stack is counted. Each sample
goes to the stage of the innermost frame on its stack that belongs to one (`STAGES`: the event
loop, metrics, detokenize, chat template, tokenize, route, SSE write, relay per item, encode and
send, validate, parse, the rest of the request). A stage's CPU is its samples times the tick,
per request; the change per token comes from the 1- and 256-token loads: (256-token − 1-token)
/ 255. Each load's top frames per stage are in the JSON, to see what a stage holds.

The check that the table is the whole cost: the samples add up to the frontend's CPU time that
the kernel counted over the same windows (``/proc``, read from outside), within 10 %, and its
main thread (whose stacks are sampled) holds that CPU; each load runs in `ROUNDS` interleaved
rounds, pooled.

    python benchmarks/frontend_stages.py [--requests 6000]   # 2 cores
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import re
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _cpu_sampler import TICK
from _harness import machine, run_benchmark
from frontend_overhead import echo_stack, start_echo_frontend, stream_tokens, throughput

from dynamo_nb import ManagedProcess

LENGTHS = (1, 32, 256)  # output tokens per stream
CONCURRENCY = 32
BAR_PCT = 10.0  # the samples' total against the kernel's count of the frontend's CPU
ROUNDS = 3  # of each load; their samples and CPU pooled
FRONTEND_CORE = {0}  # the frontend alone on it; the client and the worker on the others
OTHER_CORES = set(range(1, os.cpu_count() or 2)) or FRONTEND_CORE
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    """A stage of the hot path: the frames in it, each a ``file`` path fragment and a pattern
    of the function's own name (a frame reads ``Class.method``: the method is matched), and
    whether it is paid per token (else per request)."""

    name: str
    frames: tuple[tuple[str, str], ...]
    per_token: bool = False

    def holds(self, function: str, file: str) -> bool:
        name = function.rpartition(".")[2]
        return any(part in file and re.fullmatch(pattern, name) for part, pattern in self.frames)


# A sample belongs to the innermost frame on its stack that some stage holds (the stages tried in
# this order for each frame): a sample in the metrics called from the SSE writer is the metrics'.
STAGES = (
    Stage("event loop", (("runtime/program.py", "run_tuned"),)),
    Stage("metrics", (("frontend/metrics.py", ".*"), ("frontend/loop_histogram.py", ".*"),
                      ("prometheus_client/", ".*")), per_token=True),  # an inter-token latency each
    Stage("detokenize", (("llm/detokenize.py", ".*"), ("tokenizers/", ".*")), per_token=True),
    Stage("chat template", (("llm/tokenizer.py", "render_chat.*|_template"), ("jinja2/", ".*"))),
    Stage("tokenize", (("llm/tokenizer.py", "encode.*|fewest_tokens"), ("llm/segment_cache.py", ".*"))),
    Stage("route", (("dynamo_nb/router/", ".*"),)),
    Stage("SSE write", (("frontend/writers.py", ".*"), ("http/http_server.py", "send|drained|_done"),
                        ("http/connections.py", ".*"), ("http/messages.py", "_framed|write.*")), per_token=True),
    Stage("relay per item", (("frontend/relay.py", ".*"), ("frontend/watchdog.py", ".*"),
                             ("runtime/bounded_decode.py", ".*"), ("runtime/planes/channel.py", ".*"),
                             ("runtime/planes/wire.py", "feed|_decode.*|unpack.*"),
                             ("runtime/planes/tcp.py", "data_received|_dispatch"), ("runtime/streams.py", ".*"),
                             ("runtime/client.py", "__anext__|_?next.*")),
          per_token=True),
    Stage("encode and send", (("runtime/", ".*"),)),
    Stage("validate", (("frontend/openai.py", ".*"), ("llm/limits.py", ".*"), ("frontend/pipeline.py", "check_.*"))),
    Stage("parse", (("http/", ".*"),)),
    Stage("the rest of the request", (("dynamo_nb/", ".*"),)),
)  # fmt: skip
EVENT_LOOP = "event loop"
FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def stage_of(stack: list[str]) -> tuple[str, str]:
    """The stage of one sampled stack (outermost frame first, as `_cpu_sampler` writes it) and the frame
    that put it there (``function (file)``; for the event loop, the innermost frame)."""
    frames = [(m["function"], m["file"]) for part in stack if (m := FRAME.match(part.strip()))]
    for function, file in reversed(frames):
        for stage in STAGES:
            if stage.holds(function, file):
                return stage.name, f"{function} ({_short(file)})"
    function, file = frames[-1] if frames else ("?", "?")
    return EVENT_LOOP, f"{function} ({_short(file)})"  # asyncio's own work


def _short(file: str) -> str:
    return re.sub(r"^.*?/(dynamo_nb|site-packages|python3\.\d+)/", "", file)


def read_samples(raw: Path) -> tuple[collections.Counter[str], dict[str, collections.Counter[str]]]:
    """What `_cpu_sampler` wrote (py-spy's raw format: one stack and its count a line; ``#``, a
    comment): samples per stage, and per
    stage the frames that put samples there."""
    counts: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit() and not line.startswith("#"):
            stage, frame = stage_of(stack.split(";"))
            counts[stage] += int(count)
            frames[stage][frame] += int(count)
    return counts, frames


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` (and those it starts later) on ``cores``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def _window_written(output: Path) -> list[int] | None:
    """The main thread's and the process's CPU (ns) over the window the sampler wrote to
    ``output`` (its last line), or None while it has not."""
    if not output.exists():
        return None
    return [int(ns) for ns in output.read_text().rstrip().rpartition("\n")[2].removeprefix("# ").split()]


async def sampled_window(frontend: ManagedProcess, output: Path) -> tuple[Path, list[int]]:
    """Ask the frontend's sampler (``SIGUSR1``) for the stacks counted since it was last asked:
    the file they are in, and the main thread's and the process's CPU (ns) over that window."""
    output.unlink(missing_ok=True)  # noqa: ASYNC240  # a small file in a temporary folder
    os.kill(frontend.pid, signal.SIGUSR1)
    for _ in range(1000):
        if (cpu := _window_written(output)) is not None:
            return output, cpu
        await asyncio.sleep(0.01)
    raise RuntimeError(f"the frontend's sampler wrote nothing to {output} in 10 s")


async def sampled_load(
    http: aiohttp.ClientSession, frontend: ManagedProcess, samples: Path, url: str, tokens: int, requests: int
) -> dict[str, Any]:
    """``requests`` streams of ``tokens`` tokens at `CONCURRENCY`, the frontend's CPU sampled
    meanwhile (`_cpu_sampler`): the samples per stage, the kernel's CPU seconds of the window and
    the requests answered."""
    call = functools.partial(stream_tokens, http, url, tokens)
    await throughput(call, CONCURRENCY, CONCURRENCY * 4)  # warm: connections, caches
    await sampled_window(frontend, samples)  # what came before is not this load's
    cpu, started = frontend.cpu_seconds(), time.perf_counter()
    answered = await throughput(call, CONCURRENCY, requests)
    cpu, seconds = frontend.cpu_seconds() - cpu, time.perf_counter() - started
    raw, (main_ns, process_ns) = await sampled_window(frontend, samples)
    counts, frames = read_samples(raw)
    return {"tokens": tokens, "requests": requests, "seconds": seconds, "req_per_s": answered,
            "cpu_seconds": cpu, "samples": dict(counts), "rate": 1e6,
            "main_thread_cpu_ns": main_ns, "process_cpu_ns": process_ns,
            "top_frames": {stage: dict(found.most_common(4)) for stage, found in frames.items()}}  # fmt: skip


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One load's rounds as one: requests, seconds, CPU and samples summed (a sampler's error
    that differs between rounds averages out); each round's own figures kept beside."""
    samples: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for found in rounds:
        samples.update(found["samples"])
        for stage, top in found["top_frames"].items():
            frames[stage].update(top)
    total = {
        name: sum(found[name] for found in rounds)
        for name in ("requests", "seconds", "cpu_seconds", "main_thread_cpu_ns", "process_cpu_ns")
    }
    return {**rounds[0], **total, "req_per_s": total["requests"] / total["seconds"], "samples": dict(samples),
            "top_frames": {stage: dict(top.most_common(4)) for stage, top in frames.items()},
            "rounds": [{k: found[k] for k in ("requests", "seconds", "cpu_seconds")}
                       | {"samples": sum(found["samples"].values())} for found in rounds]}  # fmt: skip


TOTAL = "total (sampled)"


def stage_table(loads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stage, then the total: µs per request at each stream length,
    and the change per token from the shortest to the longest streams."""
    by_tokens = {load["tokens"]: load for load in loads}
    per_token = {stage.name for stage in STAGES if stage.per_token}
    rows = []
    for name in [*(stage.name for stage in STAGES), TOTAL]:
        paid = "per token" if name in per_token else "" if name == TOTAL else "per request"
        row: dict[str, Any] = {"stage": name, "paid": paid}
        for tokens, load in by_tokens.items():
            count = sum(load["samples"].values()) if name == TOTAL else load["samples"].get(name, 0)
            seconds = count / load["rate"]
            row[f"us_per_request_{tokens}"] = seconds / load["requests"] * 1e6
        first, last = min(by_tokens), max(by_tokens)
        row["us_per_token"] = (row[f"us_per_request_{last}"] - row[f"us_per_request_{first}"]) / (
            last - first
        )
        rows.append(row)
    return rows


async def main(requests: int) -> dict[str, Any]:
    # everything this starts (etcd, the worker) inherits the other cores; the frontend alone is
    # moved to its own: what it measures is its own work, not its wait for a core
    os.sched_setaffinity(0, OTHER_CORES)
    with tempfile.TemporaryDirectory() as folder:
        async with echo_stack() as stack:
            samples = Path(folder) / "samples.txt"
            sampler = (str(ROOT / "benchmarks" / "_cpu_sampler.py"), str(samples))
            frontend, url = await start_echo_frontend(stack.http, stack.etcd, program=sampler)
            stack.programs.append(frontend)
            pin(frontend.pid, FRONTEND_CORE)
            rounds: dict[int, list[dict[str, Any]]] = {tokens: [] for tokens in LENGTHS}
            for _ in range(ROUNDS):  # interleaved: a drift of the machine reaches every length alike
                for tokens in LENGTHS:
                    total = {1: 2 * requests, 32: requests}.get(tokens, max(requests // 4, CONCURRENCY * 4))
                    rounds[tokens].append(
                        await sampled_load(stack.http, frontend, samples, url, tokens, total)
                    )
            loads = [pooled(found) for found in rounds.values()]
    for load in loads:
        sampled = sum(load["samples"].values()) / load["rate"]
        load["sampled_cpu_seconds"] = sampled
        load["sampled_vs_measured_pct"] = (sampled - load["cpu_seconds"]) / load["cpu_seconds"] * 100
        load["main_thread_share_pct"] = load["main_thread_cpu_ns"] / max(load["process_cpu_ns"], 1) * 100
    return {
        "benchmark": "frontend_stages",
        "machine": machine(),
        "setup": f"echo worker and frontend processes (etcd, TCP request plane), streamed chat requests at "
        f"concurrency {CONCURRENCY}, the frontend's CPU sampled at each tick it runs ({1 / TICK:.0f} Hz)",
        "loads": loads,
        "stages": stage_table(loads),
        "bar_pct": BAR_PCT,
        "stages_add_up": all(abs(load["sampled_vs_measured_pct"]) <= BAR_PCT for load in loads),
    }


def print_table(result: dict[str, Any]) -> None:
    lengths = [load["tokens"] for load in result["loads"]]
    print(
        f"{'stage':<32} {'paid':<12} "
        + " ".join(f"{f'µs/req, {n} tok':>16}" for n in lengths)
        + f" {'µs/token':>9}"
    )
    for row in result["stages"]:
        cells = " ".join(f"{row[f'us_per_request_{n}']:>16.1f}" for n in lengths)
        print(f"{row['stage']:<32} {row['paid']:<12} {cells} {row['us_per_token']:>9.2f}")
    for load in result["loads"]:
        print(
            f"{load['tokens']:>4} tokens: {load['req_per_s']:.0f} req/s, frontend CPU {load['cpu_seconds']:.2f} s "
            f"(kernel) vs {load['sampled_cpu_seconds']:.2f} s sampled: {load['sampled_vs_measured_pct']:+.1f} %"
        )
    print("stages add up (within", result["bar_pct"], "%):", result["stages_add_up"])


if __name__ == "__main__":
    run_benchmark(__doc__, "frontend_stages", main, print_table, requests=6000,
                  requests_help="32-token requests (twice as many 1-token ones, a quarter as many 256-token ones)")  # fmt: skip
