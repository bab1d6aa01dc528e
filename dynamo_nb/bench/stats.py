"""`summary`: percentiles and throughput per concurrency level or request rate; JSON and CSV out, JSON in."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .records import records_frame

__all__ = [
    "PERCENTILES",
    "level_column",
    "load_json",
    "median_interval",
    "save_csv",
    "save_json",
    "spread",
    "summary",
]

PERCENTILES = (50, 90, 99)


def _percentiles(values: np.ndarray, name: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{name}_p{p}_ms": math.nan for p in PERCENTILES}
    points = np.percentile(values, PERCENTILES) * 1000.0
    return {f"{name}_p{p}_ms": float(v) for p, v in zip(PERCENTILES, points, strict=False)}


def level_column(df: pd.DataFrame) -> str:
    """``"rate"`` for a rate sweep (open loop), else ``"concurrency"``."""
    return "rate" if "rate" in df and df["rate"].notna().any() else "concurrency"


def spread(
    df: pd.DataFrame, metric: str = "ttft", repeat: str = "repeat", *, by: str = "label", q: float = 0.5
) -> pd.DataFrame:
    """Each group's ``metric`` at quantile ``q`` (``ttft``, ``e2e`` in ms; the median unless told)
    in every repeat of a comparison, and their spread: one row per group (``by``, the label unless
    told), a column per repeat, then ``median_ms`` (of the repeats' figures), ``low_ms`` and
    ``high_ms`` (the lowest and highest). Two groups whose ranges do not overlap differ by more than
    the run-to-run noise these repeats saw. Failed requests are left out.

    Example::

        frames = [(await bench.run(url, model, label=mode, ...)).assign(repeat=r)
                  for r in range(3) for mode, url in frontends.items()]
        bench.spread(pd.concat(frames))  # label × repeat medians, median_ms, low_ms, high_ms
        bench.spread(df, "e2e", q=0.9)  # each repeat's p90 end-to-end instead
    """
    column = f"{metric}_s"
    roles = {
        column: f"the measured {metric}",
        repeat: f"each run's round (.assign({repeat}=...))",
        by: "the groups",
    }
    missing = [f"{name!r} ({role})" for name, role in roles.items() if name not in df]
    if missing:
        raise ConfigError(f"spread needs the columns {', '.join(missing)}")
    if not 0.0 <= q <= 1.0:
        raise ConfigError(f"spread's q is a quantile between 0 and 1, not {q}")
    ok = df[df["error"].isna()] if "error" in df else df
    table = ok.groupby([by, repeat], sort=False)[column].quantile(q).mul(1000.0).unstack(repeat)
    repeats = table.columns
    table["median_ms"] = table[repeats].median(axis=1)
    table["low_ms"] = table[repeats].min(axis=1)
    table["high_ms"] = table[repeats].max(axis=1)
    return table


def _order_statistic(n: int, confidence: float) -> int:
    """The largest ``k`` such that the ``k``-th lowest and ``k``-th highest of ``n`` values hold
    their median with at least ``confidence`` (0 when none does): exact binomial tails up to 1000
    values, the normal approximation above."""
    if n > 1000:
        z = statistics.NormalDist().inv_cdf((1.0 + confidence) / 2.0)
        return max(0, math.floor(n / 2.0 - z * math.sqrt(n) / 2.0))
    allowed = (1.0 - confidence) / 2.0 * 2.0**n  # the most outcomes a tail may hold, of 2**n
    best, tail = 0, 0  # tail: outcomes with at most k - 1 values under the median
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1)
        if tail > allowed:
            break
        best = k
    return best


def median_interval(values: Any, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(low, median, high)``: the median of ``values`` and an interval around it that holds the
    true median at least ``confidence`` of the time, whatever the values' distribution (two order
    statistics: the ``k``-th lowest and the ``k``-th highest value, ``k`` the largest whose
    binomial coverage reaches ``confidence``). NaN values are left out. Too few values for any
    such interval (fewer than 6 at 95 %) give NaN bounds: say "in each of the runs" instead.

    For paired runs (the same requests, or rounds, under two settings) pass the differences: an
    interval that excludes 0 is a difference the noise these pairs saw does not explain.

    Example:
        >>> median_interval([10, 11, 12, 13, 14, 15, 16])
        (10.0, 13.0, 16.0)
        >>> median_interval([1, 2, 3])  # no 95 % interval from three values
        (nan, 2.0, nan)
    """
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"median_interval's confidence is between 0 and 1, not {confidence}")
    data = np.sort(np.asarray(values, dtype=float))
    data = data[~np.isnan(data)]
    if data.size == 0:
        return math.nan, math.nan, math.nan
    n, middle = int(data.size), float(np.median(data))
    best = _order_statistic(n, confidence)
    if best == 0:
        return math.nan, middle, math.nan
    return float(data[best - 1]), middle, float(data[n - best])


def group_keys(df: pd.DataFrame) -> list[str]:
    """``[level]``, or ``["label", level]`` when the frame holds several labels; the level is
    ``concurrency``, or ``rate`` for a rate sweep."""
    level = level_column(df)
    return ["label", level] if df["label"].nunique() > 1 else [level]


def level_duration(group: pd.DataFrame) -> float:
    """Seconds from a level's first send to its last answer (NaN for no requests). Rows of several
    runs tagged with a ``repeat`` column (each run's ``sent_s`` counts from its own start) take the
    sum of each run's span, so rates over them are their requests over the time they ran."""
    if not len(group):
        return math.nan
    if "repeat" in group and group["repeat"].nunique() > 1:
        return float(sum(level_duration(run.drop(columns="repeat")) for _, run in group.groupby("repeat")))
    return float((group["sent_s"] + group["e2e_s"]).max() - group["sent_s"].min())


def offered_and_achieved(group: pd.DataFrame) -> tuple[float, float]:
    """A level's requests per second as they arrived (over the span of their sends) and as they
    were answered (successful answers over the span of their ends); NaN for under two.

    In a steady state every answer ends about one latency after its request arrived, so both
    spans match and so do the rates; when requests arrive faster than the server answers, the
    answers come at the server's capacity and its queue grows for as long as the level runs.
    Run levels several latencies long (`bench.run` sends 4 s of arrivals per rate by default):
    on a short level the latency's spread alone moves the answers' span.
    """
    ok = group[group["error"].isna()]
    if len(group) < 2 or len(ok) < 2:
        return math.nan, math.nan
    sent, ended = group["sent_s"], ok["sent_s"] + ok["e2e_s"]
    sent_span, ended_span = float(sent.max() - sent.min()), float(ended.max() - ended.min())
    offered = (len(group) - 1) / sent_span if sent_span > 0 else math.inf
    achieved = (len(ok) - 1) / ended_span if ended_span > 0 else math.inf
    return offered, achieved


def mean_gaps_s(df: pd.DataFrame) -> pd.Series:
    """Each request's mean gap between tokens, in seconds (NaN for fewer than two tokens)."""
    return df["itl_s"].map(lambda gaps: float(np.mean(gaps)) if isinstance(gaps, list) and gaps else math.nan)


def level_summary(group: pd.DataFrame) -> dict[str, Any]:
    """The summary row of one level's requests."""
    ok = group[group["error"].isna()]
    duration = level_duration(group)
    gaps = [gap for gaps in ok["itl_s"] if isinstance(gaps, list) for gap in gaps]
    tokens = int(ok["output_tokens"].fillna(0).sum())
    row: dict[str, Any] = {"requests": len(group), "errors": int(group["error"].notna().sum())}
    row.update(_percentiles(ok["ttft_s"].dropna().to_numpy(dtype=float), "ttft"))
    row.update(_percentiles(np.asarray(gaps, dtype=float), "itl"))
    row.update(_percentiles(ok["e2e_s"].dropna().to_numpy(dtype=float), "e2e"))
    row["req_per_s"] = len(ok) / duration if duration > 0 else math.nan
    row["output_tok_per_s"] = tokens / duration if duration > 0 else math.nan
    row["mean_output_tokens"] = tokens / len(ok) if len(ok) else math.nan
    return row


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """p50/p90/p99 of TTFT, inter-token latency and end-to-end (ms), requests/s and output tokens/s.

    One row per concurrency level or request rate (per label and level when ``df`` holds
    several labels).
    Percentiles count successful requests only; throughput is successful requests (and
    their output tokens) over the level's wall time, first send to last answer. Several runs
    of one label and level concatenated: tag each run's rows with ``.assign(repeat=i)`` (each
    run's times count from its own start), and the wall time is the sum of the runs'.

    Example::

        bench.summary(df)[["ttft_p50_ms", "itl_p50_ms", "req_per_s"]]
    """
    keys = group_keys(df)
    rows = []
    for key, group in df.groupby(keys, sort=False):
        values = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, values, strict=False)), **level_summary(group)})
    return pd.DataFrame(rows).set_index(keys)


def save_json(df: pd.DataFrame, path: str | Path, **config: Any) -> Path:
    """Write ``{"config", "summary", "requests"}`` to ``path`` (folders are created).

    Example::

        bench.save_json(df, "results/sweep.json", url=url, model="tiny-llama")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = summary(df).reset_index()
    document = {
        "config": config,
        "summary": json.loads(table.to_json(orient="records")),
        "requests": json.loads(df.to_json(orient="records")),
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def save_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write one row per request to ``path`` (CSV; folders are created), in milliseconds, with
    the names load-test plots use: ``time_to_first_token_ms``, ``inter_token_latency_ms`` (the
    request's mean gap), ``request_latency_ms``, ``output_sequence_length``,
    ``input_sequence_length``, beside the level (``concurrency`` or ``rate``), ``label``,
    ``worker`` and ``error``.

    Example::

        bench.save_csv(df, "results/sweep.csv")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(
        {
            "label": df["label"],
            "concurrency": df["concurrency"],
            "rate": df["rate"],
            "sent_ms": df["sent_s"] * 1000.0,
            "time_to_first_token_ms": df["ttft_s"] * 1000.0,
            "inter_token_latency_ms": mean_gaps_s(df) * 1000.0,
            "request_latency_ms": df["e2e_s"] * 1000.0,
            "output_sequence_length": df["output_tokens"],
            "input_sequence_length": df["input_tokens"],
            "worker": df["worker"],
            "error": df["error"],
        }
    )
    table.to_csv(path, index=False)
    return path


def load_json(path: str | Path) -> pd.DataFrame:
    """The per-request DataFrame from a file written by `save_json`, with the columns a run gave
    its rows beside the records' own (a ``repeat`` tag, a ``speed`` or ``path`` label), so a
    comparison's spread comes back with it."""
    requests = json.loads(Path(path).read_text())["requests"]
    frame = records_frame(requests)
    tagged = pd.DataFrame.from_records(requests)
    for column in tagged.columns.difference(frame.columns, sort=False):
        frame[column] = tagged[column]
    return frame
