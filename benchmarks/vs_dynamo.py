"""Our frontend + mocker against NVIDIA Dynamo's, side by side, in one run.

Both systems run on this machine at once, each over its own etcd and NATS (started here with
`LocalServices`): a frontend and two mockers, one at speedup 100 (model ``tiny-fast``), one at
speedup 1 (``tiny-slow``), both with the same model folder (the recipe's 2000-token
tokenizer: Dynamo's mocker emits token ids beyond our built-in model's 512) and the same KV
pool (``KV_POOL``: 16384 blocks of 64 tokens, Dynamo's mocker's defaults). The same load
generator (`dynamo_nb.bench`, this process) drives them in turn, alternating the systems at every
level: concurrency 1, 8, 32 and 128, keep-alive connections and a new connection per request,
32-token streams; at speedup 100 also 256-token streams at concurrency 32 and 128 (where the
per-token cost decides) and one-token streams there (each frontend's fixed cost per request,
measured: `cost_split`). ``--runs N`` repeats the whole sweep; every run's rows are kept. Per level: requests/s, TTFT/ITL/E2E percentiles, and the CPU time of each
system's frontend and mocker per request; ratios are ours / Dynamo's. At speedup 100 and
concurrency 32 and 128 a third stack, our frontend as two processes on one port
(``--http-workers 2``), measures capacity against the number of frontend processes.

Dynamo (``ai-dynamo==1.6.1``) runs from its own virtual environment: pass its Python with
``--peer-python`` (recipe: ``../shared/peers/dynamo/README.md``). Without it the benchmark says
so and exits.

    python benchmarks/vs_dynamo.py --peer-python ~/dynpeer/venv/bin/python [--requests 1000] [--runs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _harness import RESULTS, fresh_prompts, machine

from dynamo_nb import LocalServices, bench, launch
from dynamo_nb.models import tiny_model_path
from dynamo_nb.runtime.program import run_tuned

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 32
LONG_TOKENS, LONG_LEVELS = 256, (32, 128)  # the long-stream levels, at speedup 100
SHORT_TOKENS = 1  # one-token streams at the long levels: each frontend's fixed CPU per request, measured
LEVELS = (1, 8, 32, 128)
MODELS = {100.0: "tiny-fast", 1.0: "tiny-slow"}
# The same simulated KV pool for both mockers, Dynamo's defaults: 16384 blocks of 64 tokens. Ours
# defaults to vLLM's 16-token blocks, a pool a quarter the size in tokens, so the same requests
# are 4x the KV load in the decode step-time model (-25.74p^2 + 54.01p + 5.74 ms) and a step at
# c = 128 takes ~8 ms instead of ~6.3: that, not the scheduler, was the throughput gap at speedup 1.
KV_POOL = {"ours": ("--kv-cache-block-size", "64", "--num-gpu-blocks", "16384"),
           "dynamo": ("--block-size", "64", "--num-gpu-blocks-override", "16384")}  # fmt: skip
PROMPTS = bench.random_prompts(100, words=32)


def requests_at(level: int, speedup: float, scale: int) -> int:
    """Requests per level: ``scale`` at speedup 100 (fewer at c=1), a fifth of it at speedup 1."""
    count = scale if level > 1 else max(scale // 5, 50)
    return count if speedup >= 100 else max(count // 5, 4 * level, 40)


class System:
    """One stack (ours or Dynamo's): etcd + NATS, two mockers and a frontend."""

    def __init__(
        self, name: str, python: str, model: str, http_workers: int = 1, mocker_flags: tuple[str, ...] = ()
    ) -> None:
        self.name, self.python, self.model, self.http_workers = name, python, model, http_workers
        self.mocker_flags = mocker_flags or KV_POOL["dynamo" if name == "dynamo" else "ours"]
        self.services: LocalServices | None = None
        self.frontend: Any = None
        self.mockers: dict[float, Any] = {}
        self.url = ""

    def _dynamo_env(self) -> dict[str, str]:
        assert self.services is not None
        return {
            "ETCD_ENDPOINTS": "http://" + self.services.etcd_url.removeprefix("etcd://"),
            "NATS_SERVER": self.services.nats_url,
            "DYN_DISCOVERY_BACKEND": "etcd",
            "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE_HOST": "127.0.0.1",
            "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_HTTP_HOST": "127.0.0.1",
            "DYN_EVENT_PLANE": "nats",
            "DYN_SELF_HOST_METADATA": "0",
            "DYN_LOG": "warn",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PATH": os.path.dirname(self.python) + os.pathsep + os.environ.get("PATH", ""),
        }

    async def start(self, port: int) -> None:
        self.services = await LocalServices.start()
        model = self.model
        common = {"cwd": ROOT, "show_logs": False, "timeout": 180}
        for speedup, name in MODELS.items():
            if self.name == "dynamo":
                self.mockers[speedup] = await launch(
                    self.python, "-m", "dynamo.mocker", "--model-path", model, "--model-name", name,
                    "--endpoint", f"dyn://dynamo.{name.replace('-', '_')}.generate",
                    "--speedup-ratio", speedup, *self.mocker_flags, env=self._dynamo_env(), ready=None, **common,
                )  # fmt: skip
            else:
                self.mockers[speedup] = await launch(
                    ROOT / "components/mocker_worker.py", "--discovery", self.services.etcd_url,
                    "--nats-url", self.services.nats_url, "--model-path", model, "--model-name", name,
                    "--endpoint", f"dynamo.{name.replace('-', '_')}.generate", "--speedup-ratio", speedup,
                    "--log-level", "WARNING", *self.mocker_flags, **common,
                )  # fmt: skip
        if self.name == "dynamo":
            self.frontend = await launch(
                self.python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", port,
                env=self._dynamo_env(), ready=None, **common,
            )  # fmt: skip
        else:
            self.frontend = await launch(
                ROOT / "components/frontend.py", "--discovery", self.services.etcd_url,
                "--nats-url", self.services.nats_url, "--http-port", port, "--http-workers", self.http_workers,
                "--log-level", "WARNING", **common,
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        for name in MODELS.values():
            await bench.wait_for_model(
                self.url, name, instances=0 if self.name == "dynamo" else 1, timeout=180
            )

    def cpu(self, speedup: float) -> tuple[float, float]:
        return self.frontend.cpu_seconds(), self.mockers[speedup].cpu_seconds()

    async def stop(self) -> None:
        for process in [self.frontend, *self.mockers.values()]:
            if process is not None:
                await process.stop(timeout=10)
        if self.services is not None:
            await self.services.stop()


async def measure(
    system: System, speedup: float, level: int, requests: int, new_connection: bool, tokens: int = TOKENS
) -> dict[str, Any]:
    frontend_cpu, mocker_cpu = system.cpu(speedup)
    started = time.perf_counter()
    df = await bench.run(
        system.url, MODELS[speedup], prompts=fresh_prompts(requests), concurrency=level, requests=requests, max_tokens=tokens,
        ignore_eos=True, worker_ids=False, new_connection=new_connection, progress=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    frontend_after, mocker_after = system.cpu(speedup)
    ok = df[df["error"].isna()]
    if len(ok) < len(df):
        print(
            f"{system.name}: {len(df) - len(ok)} of {len(df)} failed, first: {df['error'].dropna().iloc[0]}",
            file=sys.stderr,
        )
    itl = [gap for gaps in ok["itl_s"] for gap in gaps]
    return {
        "requests": requests,
        "errors": int(df["error"].notna().sum()),
        "rps": len(ok) / wall,
        "output_tok_per_s": float(ok["output_tokens"].sum()) / wall,
        "ttft_p50_ms": quantile_ms(list(ok["ttft_s"]), 0.5),
        "ttft_p90_ms": quantile_ms(list(ok["ttft_s"]), 0.9),
        "itl_p50_ms": quantile_ms(itl, 0.5),
        "e2e_p50_ms": quantile_ms(list(ok["e2e_s"]), 0.5),
        "frontend_cpu_ms_per_request": (frontend_after - frontend_cpu) / requests * 1e3,
        "mocker_cpu_ms_per_request": (mocker_after - mocker_cpu) / requests * 1e3,
    }


def quantile_ms(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (seconds) in milliseconds; None when there are none."""
    return float(sorted(values)[int(q * (len(values) - 1))] * 1e3) if values else None


RATIOS = {  # ours / Dynamo's: above 1 is better for throughput, below 1 better for the rest
    "rps": "rps",
    "ttft_p50_ms": "ttft_p50",
    "e2e_p50_ms": "e2e_p50",
    "itl_p50_ms": "itl_p50",
    "frontend_cpu_ms_per_request": "frontend_cpu",
}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    ours, dynamo = System("ours", sys.executable, args.model), System("dynamo", args.peer_python, args.model)
    ours_2 = System("ours-2", sys.executable, args.model, http_workers=2)  # --http-workers 2
    rows = []
    try:
        await ours.start(args.port)
        await dynamo.start(args.port + 1)
        await ours_2.start(args.port + 2)
        for system in (ours, dynamo, ours_2):  # warm both: tokenizer caches, connections, JIT-free paths
            await bench.run(system.url, MODELS[100.0], prompts=PROMPTS, concurrency=8, requests=100,
                            max_tokens=TOKENS, ignore_eos=True, worker_ids=False, progress=False)  # fmt: skip
        sweep = [
            (speedup, new_connection, tokens, level)
            for speedup in (100.0, 1.0)
            for new_connection in (False, True)
            for tokens, levels in ((TOKENS, LEVELS), (LONG_TOKENS, LONG_LEVELS), (SHORT_TOKENS, LONG_LEVELS))
            if tokens == TOKENS or speedup >= 100
            for level in levels
        ]
        for run in range(args.runs):
            for speedup, new_connection, tokens, level in sweep:
                count = requests_at(level, speedup, args.requests)
                if tokens == LONG_TOKENS:  # as many tokens as the 32-token level, in longer streams
                    count = max(count * TOKENS // tokens, 2 * level)
                first, second = (ours, dynamo) if len(rows) % 2 == 0 else (dynamo, ours)
                results = {
                    s.name: await measure(s, speedup, level, count, new_connection, tokens)
                    for s in (first, second)
                }
                row = {"run": run, "speedup": speedup, "connection": "new" if new_connection else "keep-alive",
                       "tokens": tokens, "concurrency": level, "ours": results["ours"],
                       "dynamo": results["dynamo"]}  # fmt: skip
                for key, name in RATIOS.items():
                    theirs = results["dynamo"][key]
                    row[f"ratio_{name}"] = results["ours"][key] / theirs if theirs else None
                if speedup >= 100 and level >= 32 and tokens != SHORT_TOKENS:  # capacity: 2 processes too
                    row["ours_2_frontends"] = await measure(
                        ours_2, speedup, level, count, new_connection, tokens
                    )
                    row["ratio_rps_2_frontends"] = row["ours_2_frontends"]["rps"] / results["dynamo"]["rps"]
                rows.append(row)
                print_row(row)
    finally:
        await asyncio.gather(ours.stop(), dynamo.stop(), ours_2.stop())
    return {
        "rows": rows,
        "targets": targets(rows),
        "setup": {
            "machine": machine(),
            "peer": "ai-dynamo 1.6.1 frontend + mocker (its own venv)",
            "tokens_per_stream": [SHORT_TOKENS, TOKENS, LONG_TOKENS],
            "mocker_kv_pool": KV_POOL,
            "runs": args.runs,
            "note": "both systems and the load generator share the machine; systems alternate per level; "
            "ratios are ours / Dynamo's; the load generator runs as our components (uvloop, tuned collector)",
        },
    }


HEADER = (
    f"{'run':>3} {'speedup':>7} {'conn':>10} {'tok':>4} {'c':>4} │ {'req/s ours':>10} {'dynamo':>7} {'ratio':>6} │ "
    f"{'TTFT p50 ours':>13} {'dynamo':>7} │ {'E2E p50 ours':>12} {'dynamo':>7} │ {'FE CPU ms/req':>13} {'dynamo':>7}"
    f" │ {'errors':>6} {'dynamo':>6}"
)


def cell(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_row(row: dict[str, Any]) -> None:
    ours, theirs = row["ours"], row["dynamo"]
    print(
        f"{row.get('run', 0):>3} {row['speedup']:>7.0f} {row['connection']:>10} {row.get('tokens', TOKENS):>4} "
        f"{row['concurrency']:>4} │ {cell(ours['rps'], 10, 0)} "
        f"{cell(theirs['rps'], 7, 0)} {cell(row['ratio_rps'], 6, 2)} │ {cell(ours['ttft_p50_ms'], 13, 1)} "
        f"{cell(theirs['ttft_p50_ms'], 7, 1)} │ {cell(ours['e2e_p50_ms'], 12, 1)} {cell(theirs['e2e_p50_ms'], 7, 1)} │ "
        f"{cell(ours['frontend_cpu_ms_per_request'], 13, 2)} {cell(theirs['frontend_cpu_ms_per_request'], 7, 2)} │ "
        f"{ours['errors']:>6} {theirs['errors']:>6}"
        + (
            f" │ 2 frontends: {row['ours_2_frontends']['rps']:.0f} req/s" if "ours_2_frontends" in row else ""
        ),
        flush=True,
    )


def cost_split(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each frontend's CPU per token and fixed per request, where a run has a 1- and a 256-token
    level at the same connection and concurrency (speedup 100): fixed = the one-token request's
    CPU (measured, one token's share aside), per token = (the 256-token request's CPU - the
    one-token one's) / 255."""
    by_level = {
        (r["run"], r["connection"], r["concurrency"], r["tokens"]): r for r in rows if r["speedup"] >= 100
    }
    split = []
    for (run, connection, concurrency, tokens), short in sorted(by_level.items()):
        long = by_level.get((run, connection, concurrency, LONG_TOKENS))
        if tokens != SHORT_TOKENS or long is None:
            continue
        entry: dict[str, Any] = {"run": run, "connection": connection, "concurrency": concurrency}
        for system in ("ours", "dynamo"):
            cpu_short = short[system]["frontend_cpu_ms_per_request"]
            per_token_ms = (long[system]["frontend_cpu_ms_per_request"] - cpu_short) / (
                LONG_TOKENS - SHORT_TOKENS
            )
            entry[system] = {
                "per_token_us": per_token_ms * 1e3,
                "fixed_ms": cpu_short - SHORT_TOKENS * per_token_ms,
            }
        for key in ("per_token_us", "fixed_ms"):
            theirs = entry["dynamo"][key]
            entry[f"ratio_{key}"] = entry["ours"][key] / theirs if theirs > 0 else None
        split.append(entry)
    return split


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the targets name, over every run: the lowest capacity ratio at speedup 100
    (c = 32 and 128, both connections, 32- and 256-token streams), the highest TTFT and E2E p50
    ratios at c = 1 (new connections: Dynamo's keep-alive carries a Nagle stall), and the
    frontend's CPU per token and fixed per request at c = 128 (`cost_split`)."""
    capacity = [
        r["ratio_rps"]
        for r in rows
        if r["speedup"] >= 100 and r["concurrency"] >= 32 and r["tokens"] in (TOKENS, LONG_TOKENS)
    ]
    single = [r for r in rows if r["speedup"] >= 100 and r["concurrency"] == 1 and r["connection"] == "new"]
    split = [e for e in cost_split(rows) if e["concurrency"] == 128]
    worst = lambda values: max((v for v in values if v is not None), default=None)  # noqa: E731
    return {
        "capacity_ratio_min": min(capacity, default=None),
        "ttft_p50_ratio_c1_max": worst(r["ratio_ttft_p50"] for r in single),
        "e2e_p50_ratio_c1_max": worst(r["ratio_e2e_p50"] for r in single),
        "per_token_ratio_c128_max": worst(e["ratio_per_token_us"] for e in split),
        "fixed_per_request_ratio_c128_max": worst(e["ratio_fixed_ms"] for e in split),
        "cost_split": cost_split(rows),
    }


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\nOurs vs Dynamo 1.6.1: frontend + mocker, {TOKENS}- and {LONG_TOKENS}-token streams (times in ms)"
    )
    print(HEADER)
    for row in report["rows"]:
        print_row(row)
    print("\nfrontend CPU per token (µs) and fixed per request (ms), ours / Dynamo's:")
    for entry in report["targets"]["cost_split"]:
        ours, theirs = entry["ours"], entry["dynamo"]
        print(
            f"run {entry['run']} {entry['connection']:>10} c={entry['concurrency']:<4} per token "
            f"{ours['per_token_us']:6.1f} / {theirs['per_token_us']:6.1f}   fixed {ours['fixed_ms']:.3f} / "
            f"{theirs['fixed_ms']:.3f}"
        )
    print({key: value for key, value in report["targets"].items() if key != "cost_split"})


def cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer-python", default=os.environ.get("DYN_NB_PEER_PYTHON"),
                        help="Python of the venv with ai-dynamo 1.6.1 (env DYN_NB_PEER_PYTHON)")  # fmt: skip
    parser.add_argument(
        "--requests", type=int, default=1000, help="requests per level at speedup 100 (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=31480,
        help="our frontend's port; Dynamo's is the next (default: %(default)s)",
    )
    parser.add_argument("--model", default=None, help="the model folder both systems serve (default: the "
                        "recipe's tiny-llama beside the peer's venv; Dynamo's mocker emits ids our built-in "
                        "512-token vocabulary cannot decode)")  # fmt: skip
    parser.add_argument(
        "--runs",
        type=int,
        default=2,
        help="whole sweeps, one after the other, all kept (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "vs_dynamo.json", help="where the JSON goes")
    args = parser.parse_args()
    if not args.peer_python or not Path(args.peer_python).exists():
        print(
            "skipped: no Dynamo to compare with. Install ai-dynamo==1.6.1 in its own venv (recipe: "
            "../shared/peers/dynamo/README.md) and pass its Python with --peer-python PATH.",
            file=sys.stderr,
        )
        sys.exit(0)
    if args.model is None:
        recipe_model = (
            Path(os.path.abspath(args.peer_python)).parents[2] / "tiny-llama"
        )  # PEER/venv/bin/python
        args.model = str(recipe_model if (recipe_model / "tokenizer.json").exists() else tiny_model_path())
    report = run_tuned(main(args))  # the load generator runs as our components (both systems gain alike)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    cli()
