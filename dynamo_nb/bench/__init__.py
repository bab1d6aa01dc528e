"""Load generator, statistics and charts for any OpenAI-compatible server (``dynamo_nb.bench``).

Needs the ``notebook`` extra (pandas, matplotlib, tqdm).

- ``runner.py``: `run`, a load sweep over concurrency levels (closed loop) or request rates
  (open loop), one row per request; `wait_for_model`;
- ``records.py``: `records_frame`, a run's records as a DataFrame;
- ``http_client.py``: one timed request (TTFT, inter-token gaps, usage, workers), the row of `run`
  (sent with `dynamo_nb.http.LeanHttpClient`);
- ``prompts.py``: prompt sets (random, shared system prompt, multi-turn conversations);
- ``progress.py``: a sweep's progress bar; ``live.py``: `live`, a chart redrawn while `run` goes;
- ``arguments.py``: what the benchmark commands parse from their flags (comma-separated sizes);
- ``stats.py``: `summary` (percentiles and throughput per level), `spread` over repeats,
  `median_interval` (a distribution-free interval of a median), JSON and CSV in and out;
- ``slo.py``: `SLO`, goodput and attainment, `max_rate_within_slo`;
- ``charts.py``: charts of a run, as matplotlib figures;
- ``scrape.py``: a server's Prometheus metrics as a DataFrame, runs joined with routing decisions;
- ``profile.py``: `profile`, a live engine's prefill and decode step times measured into a
  timing model (Dynamo's profile-data layout) the mocker and replay load;
- ``traces.py``: request traces (the frontend's, Mooncake's, synthetic); ``trace_runner.py``:
  `run_trace`, a trace sent live at its times;
- ``fuzz.py``: property-based fuzzing of an OpenAI-compatible API (needs ``hypothesis``);
- ``__main__.py``: ``python -m dynamo_nb.bench``, a sweep from a shell.

Example::

    from dynamo_nb import bench
    df = await bench.run("http://127.0.0.1:8000", "tiny-llama",
                         prompts=bench.random_prompts(32), concurrency=[1, 8, 32],
                         requests=64, max_tokens=32, live=bench.live("ttft_itl"))
    bench.summary(df)
    bench.ttft_itl_chart(df)

    # open-loop request rates, and the highest one within an SLO
    df = await bench.run(url, "tiny-llama", rate=[2, 4, 8, 16], requests=64)
    best, table = bench.max_rate_within_slo(df, bench.SLO(ttft_ms=500, itl_ms=50))
    bench.pareto_chart(df)

From a shell::

    python -m dynamo_nb.bench --url http://127.0.0.1:8000 --model tiny-llama \\
        --concurrency 1,8,32 --out results.json --plot chart.png
"""

from __future__ import annotations

from .charts import (
    CHARTS,
    Chart,
    latency_cdf,
    layout_problems,
    pareto_chart,
    path_chart,
    per_worker_chart,
    profile_chart,
    slo_chart,
    spread_chart,
    throughput_chart,
    ttft_itl_chart,
)
from .http_client import RECORD_COLUMNS
from .live import LiveChart, live
from .profile import profile
from .prompts import (
    PROMPT_SETS,
    Prompt,
    multi_turn_prompts,
    prompt_set,
    random_prompts,
    shared_prefix_prompts,
)
from .runner import run, wait_for_model
from .scrape import histogram, parse_metrics, scrape_metrics, with_routing
from .slo import SLO, max_rate_within_slo, slo_attainment
from .stats import load_json, median_interval, save_csv, save_json, spread, summary
from .trace_runner import run_trace
from .traces import read_trace, save_trace, synthetic_trace, trace_token_ids, unseen_blocks

__all__ = [
    "CHARTS",
    "PROMPT_SETS",
    "RECORD_COLUMNS",
    "SLO",
    "Chart",
    "LiveChart",
    "Prompt",
    "histogram",
    "latency_cdf",
    "layout_problems",
    "live",
    "load_json",
    "max_rate_within_slo",
    "median_interval",
    "multi_turn_prompts",
    "pareto_chart",
    "parse_metrics",
    "path_chart",
    "per_worker_chart",
    "profile",
    "profile_chart",
    "prompt_set",
    "random_prompts",
    "read_trace",
    "run",
    "run_trace",
    "save_csv",
    "save_json",
    "save_trace",
    "scrape_metrics",
    "shared_prefix_prompts",
    "slo_attainment",
    "slo_chart",
    "spread",
    "spread_chart",
    "summary",
    "synthetic_trace",
    "throughput_chart",
    "trace_token_ids",
    "ttft_itl_chart",
    "unseen_blocks",
    "wait_for_model",
    "with_routing",
]
