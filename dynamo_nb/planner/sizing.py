"""`plan`: the fewest workers that serve a trace within an SLO, found by replaying it offline.

For an aggregated fleet it replays the trace on 1, 2, 3 … workers; for a disaggregated one on
every prefill:decode split of 2, 3 … workers in all; it stops at the first size where some
fleet meets the SLO (and replays one size more, for the table). A fleet *meets* the SLO when
the ``percentile`` (90 by default) of the requests' TTFT is within ``slo.ttft_ms``, that of
their mean inter-token gap within ``slo.itl_ms`` and that of their end-to-end time within
``slo.e2e_ms`` (the limits it sets).

Every replayed figure is a prediction with an error: ``error`` is the timing model's, measured
against a live run (`dynamo_nb.replay.model_error` of a `fidelity` table: figure → percent the
replay was off). Each fleet's TTFT and ITL at the percentile then get a band, the prediction ±
that error (the figure's own, or the larger of p50's and p90's for another percentile), the
column ``meets_within_error`` says whether the band's top meets the SLO too, and
``Plan.fleet_within_error`` is the fewest workers that do (the search goes on until one does).
Without ``error`` the answer says its error is not measured.

With ``price_per_worker_hour`` each fleet gets a cost per million input and output tokens:
the fleet's worker-hours over the trace, split between input and output by what the engines
spent their time on (disaggregated: the prefill pool's share goes to input tokens, the decode
pool's to output tokens; aggregated: the engines' prefill and decode time).

Example:
    >>> from dynamo_nb.bench import SLO, synthetic_trace
    >>> trace = synthetic_trace(300, rate=60.0, output_length=32, seed=1)
    >>> answer = plan(trace, SLO(ttft_ms=40, itl_ms=12), max_workers=6)
    >>> answer.fleet.workers, answer.table["meets"].tolist()   # 4 meets it; 5 is tried for the table
    (4, [False, False, False, True, True])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bench.slo import SLO
from ..bench.stats import mean_gaps_s
from ..errors import ConfigError
from ..replay import Fleet, MockerSettings, ReplayResult, error_band, error_band_pct, replay

if TYPE_CHECKING:
    import pandas as pd

    from ..bench.charts import Chart

__all__ = ["Plan", "Simulate", "plan"]

Simulate = Callable[..., ReplayResult]
"""How a fleet is tried: ``simulate(trace, fleet, settings, seed=...)`` (`dynamo_nb.replay.replay`
by default; a stub capacity model in tests)."""


@dataclass
class Plan:
    """The planner's answer.

    Attributes:
        fleet: the fewest workers that meet the SLO (None: none up to ``max_workers`` did).
        table: one row per fleet tried: its size, p50/p90 TTFT and ITL, SLO attainment,
            output tokens/s, cost per million tokens, ``meets`` and ``pareto`` (no other
            fleet is as small and as fast on both TTFT and ITL at the percentile).
        slo, percentile: what was asked.
        error_pct: the timing model's measured error the bands come from (None: not measured).
        fleet_within_error: the fewest workers that meet the SLO at the top of the bands (None:
            no error given, or none tried did).
    """

    fleet: Fleet | None
    table: pd.DataFrame
    slo: SLO
    percentile: float
    error_pct: dict[str, float] | None = None
    fleet_within_error: Fleet | None = None

    def chart(self) -> Chart:
        """p-th percentile TTFT and ITL against workers, the SLO's limits dashed, the answer circled;
        whole-number worker ticks, and a log scale where the fleets span more than 10× (one
        worker's queue would otherwise flatten the SLO's line into the axis)."""
        from matplotlib.ticker import MaxNLocator

        from ..bench.charts import _chart

        figure, (ttft_ax, itl_ax) = _chart(2)
        table = self.table
        p = f"p{self.percentile:g}"
        for ax, column, limit, title in (
            (ttft_ax, f"ttft_{p}_ms", self.slo.ttft_ms, f"TTFT {p} (ms)"),
            (itl_ax, f"itl_{p}_ms", self.slo.itl_ms, f"ITL {p} (ms)"),
        ):
            for split, rows in table.groupby("split", sort=False):
                line = ax.plot(rows["workers"], rows[column], marker="o", label=str(split))[0]
                if f"{column}_high" in rows:  # the measured error's band
                    ax.fill_between(rows["workers"], rows[f"{column}_low"], rows[f"{column}_high"],
                                    color=line.get_color(), alpha=0.15, label=f"{split} ± model error")  # fmt: skip
            if limit is not None:
                ax.axhline(limit, color="red", linestyle="--", alpha=0.7, label="SLO")
            chosen = table[table["chosen"]]
            ax.scatter(chosen["workers"], chosen[column], s=160, facecolors="none", edgecolors="green",
                       linewidths=2, label="answer", zorder=3)  # fmt: skip
            values = table[column].dropna()
            if len(values) and values.min() > 0 and values.max() > 10 * values.min():
                ax.set_yscale("log")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # a count of workers
            ax.set_title(f"{title} by fleet size")
            ax.set_xlabel("workers")
            ax.set_ylabel(title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
        return figure

    def __repr__(self) -> str:
        answer = self.fleet.describe() if self.fleet is not None else "no fleet tried meets it"
        if self.error_pct is None:
            error = "model error not measured"
        else:
            p = f"p{self.percentile:g}"
            bands = ", ".join(f"{name.upper()} ±{error_band_pct(self.error_pct, f'{name}_{p}_ms'):.0f} %"
                              for name in ("ttft", "itl"))  # fmt: skip
            margin = self.fleet_within_error.describe() if self.fleet_within_error else "none tried"
            error = f"{bands} (measured error): within it, {margin}"
        return f"<Plan for {self.slo} at p{self.percentile:g}: {answer}; {error}>"


def _with_bands(row: dict[str, Any], slo: SLO, percentile: float, error: dict[str, float]) -> None:
    """Add the ttft and itl bands at ``percentile`` and ``meets_within_error`` to ``row``."""
    top_meets = row["errors"] == 0
    for name, limit in (("ttft", slo.ttft_ms), ("itl", slo.itl_ms)):
        column = f"{name}_p{percentile:g}_ms"
        row[f"{column}_low"], row[f"{column}_high"] = error_band(row[column], error, column)
        top_meets = top_meets and (limit is None or row[f"{column}_high"] <= limit)
    e2e = f"e2e_p{percentile:g}_ms"
    row["meets_within_error"] = bool(top_meets and (slo.e2e_ms is None or row[e2e] <= slo.e2e_ms))


def _row(result: ReplayResult, slo: SLO, percentile: float, price: float | None) -> dict[str, Any]:
    """One fleet's line of the table."""
    requests = result.requests
    ok = requests[requests["error"].isna()]
    fleet = result.fleet
    row: dict[str, Any] = {
        "fleet": fleet.describe(),
        "workers": fleet.size,
        "prefill": fleet.prefill if fleet.disaggregated else None,
        "decode": fleet.decode if fleet.disaggregated else None,
        "split": f"{fleet.prefill}:{fleet.decode}" if fleet.disaggregated else "aggregated",
    }
    columns = {
        "ttft": ok["ttft_s"].astype(float),
        "itl": mean_gaps_s(ok).dropna().astype(float),
        "e2e": ok["e2e_s"].astype(float),
    }
    for name, values in columns.items():
        for q in (50, percentile):
            row[f"{name}_p{q:g}_ms"] = float(np.percentile(values, q)) * 1000 if len(values) else math.nan
    row["attainment"] = float(slo.met(requests).mean()) if len(requests) else math.nan
    output_tokens = float(ok["output_tokens"].fillna(0).sum())
    input_tokens = float(ok["input_tokens"].fillna(0).sum())
    row["output_tok_per_s"] = output_tokens / result.virtual_s if result.virtual_s > 0 else math.nan
    row["errors"] = int(requests["error"].notna().sum())
    if price is not None:
        hours = fleet.size * result.virtual_s / 3600.0
        if fleet.disaggregated:
            input_share = fleet.prefill / fleet.size
        else:
            busy = result.busy_s.get("prefill", 0.0) + result.busy_s.get("decode", 0.0)
            input_share = result.busy_s.get("prefill", 0.0) / busy if busy > 0 else 0.5
        cost = hours * price
        row["cost_per_m_input"] = cost * input_share / input_tokens * 1e6 if input_tokens else math.nan
        row["cost_per_m_output"] = (
            cost * (1 - input_share) / output_tokens * 1e6 if output_tokens else math.nan
        )
    row["meets"] = bool(
        row["errors"] == 0
        and all(
            limit is None or row[f"{name}_p{percentile:g}_ms"] <= limit
            for name, limit in (("ttft", slo.ttft_ms), ("itl", slo.itl_ms), ("e2e", slo.e2e_ms))
        )
    )
    return row


def _pareto(table: pd.DataFrame, percentile: float) -> list[bool]:
    """Whether each fleet is on the front: no other is as small and no slower on TTFT and ITL
    (and strictly better on one)."""
    keys = ["workers", f"ttft_p{percentile:g}_ms", f"itl_p{percentile:g}_ms"]
    points = table[keys].to_numpy(dtype=float)
    front = []
    for i, point in enumerate(points):
        dominated = any(
            j != i and np.all(other <= point) and np.any(other < point) for j, other in enumerate(points)
        )
        front.append(not dominated)
    return front


def plan(
    trace: pd.DataFrame,
    slo: SLO,
    *,
    settings: MockerSettings | None = None,
    router: str = "kv",
    disaggregated: bool = False,
    max_workers: int = 16,
    percentile: float = 90.0,
    price_per_worker_hour: float | None = None,
    seed: int = 0,
    simulate: Simulate = replay,
    error: Mapping[str, float] | None = None,
) -> Plan:
    """The fewest mocker workers (``settings``) that serve ``trace`` within ``slo`` at
    ``percentile``, by replay (see the module docstring).

    Args:
        trace: a `bench.read_trace` / `synthetic_trace` frame.
        slo: the limits (``ttft_ms``, ``itl_ms``, ``e2e_ms``) the percentile must stay within.
        settings: the engines' settings (default: the mocker worker's defaults).
        router: the router mode of every pool.
        disaggregated: search prefill:decode splits instead of aggregated workers.
        max_workers: the largest fleet tried.
        percentile: which percentile of the requests must be within the limits.
        price_per_worker_hour: adds the cost per million input and output tokens.
        seed: the routers' draws.
        simulate: how a fleet is tried (`dynamo_nb.replay.replay`).
        error: the timing model's measured error, figure → percent (`replay.model_error`):
            each fleet's band and the fleet that meets the SLO within it.

    Example::

        answer = plan(trace, bench.SLO(ttft_ms=200, itl_ms=25), price_per_worker_hour=2.5)
        answer.fleet, answer.table, answer.chart()
    """
    import pandas as pd

    if not 0 < percentile <= 100:
        raise ConfigError(f"percentile must be in (0, 100], got {percentile!r}")
    smallest = 2 if disaggregated else 1
    if max_workers < smallest:
        raise ConfigError(f"max_workers must be at least {smallest}, got {max_workers}")
    settings = settings or MockerSettings()
    measured_error = dict(error) if error is not None else None
    rows: list[dict[str, Any]] = []
    met_at: int | None = None
    met_within_error_at: int | None = None
    for size in range(smallest, max_workers + 1):
        if (
            met_at is not None
            and size > met_at + 1
            and (measured_error is None or met_within_error_at is not None)
        ):
            break
        if disaggregated:
            fleets = [Fleet(prefill=p, decode=size - p, router=router) for p in range(1, size)]
        else:
            fleets = [Fleet(workers=size, router=router)]
        for fleet in fleets:
            rows.append(
                _row(simulate(trace, fleet, settings, seed=seed), slo, percentile, price_per_worker_hour)
            )
            if measured_error is not None:
                _with_bands(rows[-1], slo, percentile, measured_error)
        if met_at is None and any(r["meets"] for r in rows[-len(fleets) :]):
            met_at = size
        if measured_error is not None and met_within_error_at is None:
            if any(r["meets_within_error"] for r in rows[-len(fleets) :]):
                met_within_error_at = size
    table = pd.DataFrame(rows)
    table["pareto"] = _pareto(table, percentile)
    table["chosen"] = False
    chosen = _fastest_at(table, met_at, "meets", percentile, router, disaggregated)
    if chosen is not None:
        table.loc[table["fleet"] == chosen.describe(), "chosen"] = True
    within = _fastest_at(table, met_within_error_at, "meets_within_error", percentile, router, disaggregated)
    return Plan(chosen, table, slo, percentile, measured_error, within)


def _fastest_at(
    table: pd.DataFrame, size: int | None, column: str, percentile: float, router: str, disaggregated: bool
) -> Fleet | None:
    """The fleet of ``size`` workers that has ``column`` true and the lowest TTFT at the percentile."""
    if size is None:
        return None
    candidates = table[(table["workers"] == size) & table[column]]
    best = candidates[f"ttft_p{percentile:g}_ms"].idxmin()
    if disaggregated:
        return Fleet(
            prefill=int(table.loc[best, "prefill"]), decode=int(table.loc[best, "decode"]), router=router
        )
    return Fleet(workers=size, router=router)
