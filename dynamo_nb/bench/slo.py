"""Service-level objectives over a load sweep: goodput, attainment, and the highest load within them.

A request *meets* an `SLO` when it succeeded and each limit set holds for it: its time to
first token (``ttft_ms``), its mean gap between tokens (``itl_ms``, what vLLM calls TPOT) and
its end-to-end time (``e2e_ms``). Per level of a sweep (`bench.run` over concurrency levels
or request rates), `slo_attainment` gives the share of requests that met it and the
*goodput* — requests that met it per second — beside the raw throughput; `max_rate_within_slo`
answers "how much load can I serve with at least 90 % of requests within the SLO?" as a
number and the table it was read from.

In a rate sweep a level can also be *saturated*: requests arrive faster than the server answers,
the queue grows for as long as the level runs, and its attainment says more about the run's
length than about the server. `slo_attainment` gives each rate level its requests per second as
they arrived and as they were answered (``offered_req_per_s``, ``achieved_req_per_s``:
`dynamo_nb.bench.stats.offered_and_achieved`) and ``keeps_up`` (answered at ``KEEPS_UP`` of
the arrival rate or faster); `max_rate_within_slo` never answers with a saturated level.

Example::

    df = await bench.run(url, "tiny-llama", rate=[2, 4, 8, 16], requests=64)
    slo = bench.SLO(ttft_ms=500, itl_ms=50)
    best, table = bench.max_rate_within_slo(df, slo)   # e.g. 8.0 req/s, and the per-rate table
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..errors import ConfigError
from .stats import group_keys, level_column, level_duration, level_summary, mean_gaps_s, offered_and_achieved

__all__ = ["KEEPS_UP", "SLO", "max_rate_within_slo", "slo_attainment"]

KEEPS_UP = 0.9  # a rate level keeps up when it is answered at this share of its arrival rate or more


@dataclass(frozen=True)
class SLO:
    """Limits a request must stay within, in milliseconds (None: not checked).

    Example:
        >>> SLO(ttft_ms=500, itl_ms=50)
        SLO(ttft_ms=500, itl_ms=50, e2e_ms=None)
    """

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        limits = {"ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "e2e_ms": self.e2e_ms}
        for name, value in limits.items():
            if value is not None and (not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(f"SLO {name} must be a positive number of milliseconds, got {value!r}")
        if all(value is None for value in limits.values()):
            raise ConfigError("an SLO needs at least one limit: ttft_ms, itl_ms or e2e_ms")

    def met(self, df: pd.DataFrame) -> pd.Series:
        """Per request of a `bench.run` frame: whether it succeeded within every limit."""
        ok = df["error"].isna()
        if self.ttft_ms is not None:
            ok &= df["ttft_s"].astype(float) * 1000.0 <= self.ttft_ms
        if self.itl_ms is not None:
            ok &= mean_gaps_s(df).fillna(0.0) * 1000.0 <= self.itl_ms  # one token: no gap to miss
        if self.e2e_ms is not None:
            ok &= df["e2e_s"].astype(float) * 1000.0 <= self.e2e_ms
        return ok.fillna(False).astype(bool)

    def __str__(self) -> str:
        parts = [f"{name} ≤ {value:g} ms" for name, value in (("TTFT", self.ttft_ms), ("ITL", self.itl_ms),
                 ("E2E", self.e2e_ms)) if value is not None]  # fmt: skip
        return ", ".join(parts)


def slo_attainment(df: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    """Per level (and label): requests, how many met ``slo``, the share (``attainment``),
    ``goodput_req_per_s`` (requests that met it per second of the level) beside ``req_per_s``
    and ``output_tok_per_s``, and the p90 latencies; for a rate sweep also
    ``offered_req_per_s``, ``achieved_req_per_s`` and ``keeps_up`` (see the module docstring).

    Example::

        bench.slo_attainment(df, bench.SLO(ttft_ms=500))[["attainment", "goodput_req_per_s"]]
    """
    met = slo.met(df)
    keys = group_keys(df)
    rows = []
    for key, group in df.groupby(keys, sort=True):
        values = key if isinstance(key, tuple) else (key,)
        row = level_summary(group)
        duration = level_duration(group)
        good = int(met[group.index].sum())
        rows.append(
            {
                **dict(zip(keys, values, strict=False)),
                "requests": len(group),
                "met_slo": good,
                "attainment": good / len(group) if len(group) else math.nan,
                "goodput_req_per_s": good / duration if duration > 0 else math.nan,
                "req_per_s": row["req_per_s"],
                "output_tok_per_s": row["output_tok_per_s"],
                "ttft_p90_ms": row["ttft_p90_ms"],
                "itl_p90_ms": row["itl_p90_ms"],
                "e2e_p90_ms": row["e2e_p90_ms"],
            }
        )
        if keys[-1] == "rate":
            offered, achieved = offered_and_achieved(group)
            rows[-1]["offered_req_per_s"] = offered
            rows[-1]["achieved_req_per_s"] = achieved
            rows[-1]["keeps_up"] = bool(achieved >= KEEPS_UP * offered)
    return pd.DataFrame(rows).set_index(keys)


def max_rate_within_slo(
    df: pd.DataFrame, slo: SLO, *, attainment: float = 0.9
) -> tuple[float | None, pd.DataFrame]:
    """The highest level (request rate, or concurrency) of the sweep at which at least
    ``attainment`` of the requests met ``slo`` — and every lower level did too — with the
    `slo_attainment` table and a ``within_slo`` column. In a rate sweep a level must also keep
    up with its offered rate (``keeps_up``): a saturated level's queue grows for as long as it
    runs, so it is never the answer. None when even the lowest level misses.

    Example::

        best, table = bench.max_rate_within_slo(df, bench.SLO(ttft_ms=500), attainment=0.9)
    """
    if not 0 < attainment <= 1:
        raise ConfigError(f"attainment is a share of requests in (0, 1], got {attainment!r}")
    if df["label"].nunique() > 1:
        raise ConfigError("the frame holds several labels: pass one run (df[df.label == ...])")
    table = slo_attainment(df, slo)
    table["within_slo"] = table["attainment"] >= attainment
    if "keeps_up" in table:
        table["within_slo"] &= table["keeps_up"]
    best: float | None = None
    for level, row in table.iterrows():
        if not row["within_slo"]:
            break
        best = float(level)
    table.attrs.update(slo=str(slo), attainment=attainment, level=level_column(df))
    return best, table
