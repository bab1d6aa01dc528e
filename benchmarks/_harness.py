"""What every benchmark script shares: its command line, the JSON it writes, the table it prints."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_SEEDS = itertools.count(1)


def fresh_prompts(count: int, words: int = 32) -> list[Any]:
    """``count`` random user messages of ``words`` words, none sent before in this run (a new
    seed each call): as in real traffic, the kit's frontend finds no prompt it has tokenized
    already (`dynamo_nb.llm.segment_cache`), so a comparison with a peer's frontend is fair."""
    from dynamo_nb import bench

    return bench.random_prompts(count, words=words, seed=next(_SEEDS))


async def level_figures(url: str, model: str, level: int, requests: int, **options: Any) -> dict[str, Any]:
    """One concurrency level of `dynamo_nb.bench.run` at ``url`` (``options``: its keywords, the
    prompts, ``max_tokens`` …; no progress bar, no worker ids): the figures a row reports."""
    from dynamo_nb import bench

    df = await bench.run(url, model, concurrency=level, requests=requests, worker_ids=False, progress=False,
                         **options)  # fmt: skip
    row = bench.summary(df).iloc[0]
    names = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms", "req_per_s", "mean_output_tokens")
    return {
        "requests": int(row["requests"]),
        "errors": int(row["errors"]),
        **{n: float(row[n]) for n in names},
    }


def machine() -> str:
    """The machine a result was measured on, for its JSON: architecture, processor model, cores,
    Python (figures move between processors; ratios measured in one run are what compare)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model
            )
    except OSError:
        pass
    return f"{platform.machine()} ({model}), {os.cpu_count()} cores, Python {platform.python_version()}"


def run_benchmark(
    doc: str,
    name: str,
    main: Callable[..., Coroutine[Any, Any, dict[str, Any]]],
    print_table: Callable[[dict[str, Any]], None],
    *,
    requests: int,
    requests_help: str,
    engines: tuple[str, ...] = (),
) -> None:
    """Parse ``--requests`` and ``--out``, run ``main(requests)``, write its JSON, print its table.
    ``engines``: the benchmark also takes ``--engine`` (the first is the default), passed on as
    ``main(requests, engine)``; another engine's JSON is ``{name}_{engine}.json``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--requests", type=int, default=requests, help=f"{requests_help} (default: %(default)s)"
    )
    if engines:
        parser.add_argument(
            "--engine", choices=engines, default=engines[0], help="the engine measured (default: %(default)s)"
        )
    parser.add_argument("--out", type=Path, help=f"where the JSON goes (default: results/{name}.json)")
    args = parser.parse_args()
    if engines:
        result = asyncio.run(main(args.requests, args.engine))
        default = RESULTS / (f"{name}.json" if args.engine == engines[0] else f"{name}_{args.engine}.json")
    else:
        result = asyncio.run(main(args.requests))
        default = RESULTS / f"{name}.json"
    out = args.out or default
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nwrote {out}")
