"""`summary`: percentiles and throughput per concurrency level; JSON in and out."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .runner import records_frame

__all__ = ["PERCENTILES", "load_json", "save_json", "summary"]

PERCENTILES = (50, 90, 99)


def _percentiles(values: np.ndarray, name: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{name}_p{p}_ms": math.nan for p in PERCENTILES}
    points = np.percentile(values, PERCENTILES) * 1000.0
    return {f"{name}_p{p}_ms": float(v) for p, v in zip(PERCENTILES, points, strict=False)}


def group_keys(df: pd.DataFrame) -> list[str]:
    """``["concurrency"]``, or ``["label", "concurrency"]`` when the frame holds several labels."""
    return ["label", "concurrency"] if df["label"].nunique() > 1 else ["concurrency"]


def level_summary(group: pd.DataFrame) -> dict[str, Any]:
    """The summary row of one level's requests."""
    ok = group[group["error"].isna()]
    start = group["sent_s"].min()
    duration = float((group["sent_s"] + group["e2e_s"]).max() - start) if len(group) else math.nan
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

    One row per concurrency level (per label and level when ``df`` holds several labels).
    Percentiles count successful requests only; throughput is successful requests (and
    their output tokens) over the level's wall time, first send to last answer.

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


def load_json(path: str | Path) -> pd.DataFrame:
    """The per-request DataFrame from a file written by `save_json`."""
    document = json.loads(Path(path).read_text())
    return records_frame(document["requests"])
