"""`retune`: the KV router's knobs that serve a recorded trace best, found by replaying it.

Each point of a grid over `dynamo_nb.router.policy.RouterPolicy`'s knobs (``overlap_score_credit``,
``prefill_load_scale``, ``temperature``) replays the trace (or its last ``window_s`` seconds)
on the same simulated fleet, with the real KV router deciding (`dynamo_nb.replay`). The table
has each point's TTFT (mean, p50, p90), ITL (p50, p90), prefix reuse (cached over prompt
tokens), output tokens/s and, with an SLO, goodput; the winner is the best on ``objective``,
and its margin is how much better than the incumbent's (the policy running now) it is, in %.
The incumbent is always replayed too. The same trace, fleet, grid and seed give the same answer.
With ``error``, the replay's measured error (`dynamo_nb.replay.model_error`), each policy's
objective gets a band (± `dynamo_nb.replay.error_band_pct`), and ``beyond_error`` says whether
the winner is better than the incumbent even at the bands' worst.

Example:
    >>> from dynamo_nb.bench import synthetic_trace
    >>> trace = synthetic_trace(200, rate=40.0, seed=2)
    >>> answer = retune(trace, {"prefill_load_scale": [1, 8]}, fleet=Fleet(workers=3))
    >>> len(answer.table), answer.incumbent == RouterPolicy()
    (2, True)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bench.slo import SLO
from ..bench.stats import mean_gaps_s
from ..errors import ConfigError
from ..replay import Fleet, MockerSettings, ReplayResult, error_band, error_band_pct, replay
from ..router.policy import RouterPolicy
from .sizing import Simulate

if TYPE_CHECKING:
    import pandas as pd

    from ..bench.charts import Chart

__all__ = ["HIGHER_IS_BETTER", "Retune", "last_window", "objective_label", "retune"]

HIGHER_IS_BETTER = frozenset({"reuse", "output_tok_per_s", "goodput_req_per_s"})
"""Objectives to maximise; every other column (latencies) is minimised."""

Grid = Mapping[str, Sequence[float]] | Sequence[RouterPolicy]


_LABELS = {
    "ttft_mean_ms": "mean TTFT (ms)",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "ttft_p90_ms": "TTFT p90 (ms)",
    "itl_p50_ms": "ITL p50 (ms)",
    "itl_p90_ms": "ITL p90 (ms)",
    "reuse": "share of prompt tokens reused",
    "goodput_req_per_s": "goodput (requests/s within the SLO)",
    "output_tok_per_s": "output tokens/s",
}


def objective_label(objective: str) -> str:
    """How a chart names an objective column.

    Example:
        >>> objective_label("ttft_mean_ms"), objective_label("queue_depth")
        ('mean TTFT (ms)', 'queue depth')
    """
    return _LABELS.get(objective, objective.replace("_", " "))


@dataclass
class Retune:
    """`retune`'s answer.

    Attributes:
        table: one row per policy replayed (its knobs, the measures, ``incumbent``, ``winner``).
        winner: the best policy on ``objective`` (the incumbent when none beats it).
        incumbent: the policy it was compared with.
        objective: the table column compared.
        margin_pct: how much better the winner is than the incumbent on ``objective``, in %
            (0 when the incumbent wins).
        error_pct: the measured error the bands come from (None: not measured).
        beyond_error: whether the winner's band clears the incumbent's (None: no error given).
    """

    table: pd.DataFrame
    winner: RouterPolicy
    incumbent: RouterPolicy
    objective: str
    margin_pct: float
    error_pct: dict[str, float] | None = None
    beyond_error: bool | None = None

    def beats_incumbent_by(self, percent: float) -> bool:
        """Whether the winner beats the incumbent by more than ``percent`` (the change to apply)."""
        return self.winner != self.incumbent and self.margin_pct > percent

    def chart(self) -> Chart:
        """The objective for each policy (its measured error as error bars), the incumbent and
        the winner marked."""
        from ..bench.charts import _chart

        table = self.table
        figure, (ax,) = _chart(1, width=6.4, height=1.6 + 0.32 * len(table))  # a row per policy
        labels = [describe(policy) for policy in table["policy"]]
        colors = [
            "green" if w else "grey" if i else "steelblue"
            for w, i in zip(table["winner"], table["incumbent"], strict=True)
        ]
        band = None
        if f"{self.objective}_high" in table:  # the measured error, as error bars
            band = [table[self.objective] - table[f"{self.objective}_low"],
                    table[f"{self.objective}_high"] - table[self.objective]]  # fmt: skip
        ax.barh(range(len(table)), table[self.objective], color=colors, xerr=band, capsize=3)
        ax.set_yticks(range(len(table)), labels, fontsize="small")  # labels on their own rows
        ax.invert_yaxis()  # the table's order, top down
        label = objective_label(self.objective)
        ax.set_xlabel(label)
        ax.set_title(f"{label} by router policy\n(green: the winner, grey: the incumbent)", fontsize="medium")
        ax.grid(True, axis="x", alpha=0.3)
        return figure

    def __repr__(self) -> str:
        if self.error_pct is None:
            error = "model error not measured"
        else:
            band = error_band_pct(self.error_pct, self.objective)
            error = f"±{band:.0f} % measured error: {'beyond' if self.beyond_error else 'within'} it"
        return (
            f"<Retune on {self.objective}: {describe(self.winner)}, {self.margin_pct:.1f} % better than "
            f"{describe(self.incumbent)}; {error}>"
        )


def describe(policy: RouterPolicy) -> str:
    """``credit 1, scale 32, temp 0``: a policy in a few characters."""
    return (
        f"credit {policy.overlap_score_credit:g}, scale {policy.prefill_load_scale:g}, "
        f"temp {policy.temperature:g}"
    )


def grid_policies(grid: Grid, base: RouterPolicy) -> list[RouterPolicy]:
    """The policies of ``grid``: given as policies, or as knob → values (every combination,
    the other knobs as in ``base``).

    Example:
        >>> [p.prefill_load_scale for p in grid_policies({"prefill_load_scale": [1, 16]}, RouterPolicy())]
        [1.0, 16.0]
    """
    if isinstance(grid, Mapping):
        if not grid:
            raise ConfigError(
                "the grid is empty: give knob → values, e.g. {'prefill_load_scale': [1, 8, 32]}"
            )
        names = list(grid)
        return [
            base.changed(dict(zip(names, values, strict=True)))
            for values in itertools.product(*grid.values())
        ]
    policies = list(grid)
    if not policies or not all(isinstance(p, RouterPolicy) for p in policies):
        raise ConfigError("the grid is knob → values, or a list of RouterPolicy")
    return policies


def last_window(trace: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """The requests of ``trace`` that arrived in its last ``window_s`` seconds.

    Example:
        >>> from dynamo_nb.bench import synthetic_trace
        >>> len(last_window(synthetic_trace(100, rate=10.0, seed=1), 5.0)) < 100
        True
    """
    if window_s <= 0:
        raise ConfigError(f"window_s must be a positive number of seconds, got {window_s}")
    stamps = trace["timestamp_ms"].astype(float)
    return trace[stamps >= stamps.max() - window_s * 1000.0]


def _row(policy: RouterPolicy, result: ReplayResult, slo: SLO | None) -> dict[str, Any]:
    requests = result.requests
    ok = requests[requests["error"].isna()]
    ttft = ok["ttft_s"].astype(float) * 1000
    itl = mean_gaps_s(ok).dropna().astype(float) * 1000
    row: dict[str, Any] = {"policy": policy, **policy.to_dict()}
    row["ttft_mean_ms"] = float(ttft.mean()) if len(ttft) else math.nan
    for name, values in (("ttft", ttft), ("itl", itl)):
        for q in (50, 90):
            row[f"{name}_p{q}_ms"] = float(np.percentile(values, q)) if len(values) else math.nan
    prompt = float(ok["input_tokens"].fillna(0).sum())
    row["reuse"] = float(ok["cached_tokens"].fillna(0).sum()) / prompt if prompt else math.nan
    row["output_tok_per_s"] = (
        float(ok["output_tokens"].fillna(0).sum()) / result.virtual_s if result.virtual_s > 0 else math.nan
    )
    if slo is not None:
        row["goodput_req_per_s"] = (
            float(slo.met(requests).sum()) / result.virtual_s if result.virtual_s > 0 else math.nan
        )
    row["errors"] = int(requests["error"].notna().sum())
    return row


def retune(
    trace: pd.DataFrame,
    grid: Grid,
    *,
    objective: str = "ttft_mean_ms",
    fleet: Fleet | None = None,
    settings: MockerSettings | None = None,
    incumbent: RouterPolicy | None = None,
    slo: SLO | None = None,
    window_s: float | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    simulate: Simulate = replay,
    error: Mapping[str, float] | None = None,
) -> Retune:
    """Replay ``trace`` (its last ``window_s`` seconds, if given) once per policy of ``grid``
    and the ``incumbent`` (default: `RouterPolicy()`) on ``fleet`` (default: 4 workers, KV
    router) and pick the best on ``objective`` (see the module docstring; ``goodput_req_per_s``
    needs ``slo``). ``concurrency``: replay it as a closed loop with that many requests in
    flight (`dynamo_nb.replay.replay`) instead of at the trace's times.

    Example::

        answer = retune(bench.read_trace("trace.jsonl"), {"prefill_load_scale": [1, 4, 16, 32]})
        answer.table, answer.winner, answer.margin_pct
    """
    import pandas as pd

    incumbent = incumbent or RouterPolicy()
    fleet = fleet or Fleet(workers=4)
    if fleet.router != "kv":
        raise ConfigError(
            f"retune tunes the KV router's knobs: give a fleet with router='kv', not {fleet.router!r}"
        )
    if objective == "goodput_req_per_s" and slo is None:
        raise ConfigError("the goodput objective needs an SLO: give slo=SLO(ttft_ms=..., itl_ms=...)")
    if window_s is not None:
        trace = last_window(trace, window_s)
    policies = grid_policies(grid, incumbent)
    if incumbent not in policies:
        policies = [incumbent, *policies]
    rows = []
    for policy in policies:
        loop = {} if concurrency is None else {"concurrency": concurrency}
        result = simulate(trace, replace(fleet, router_policy=policy), settings, seed=seed, **loop)
        rows.append(_row(policy, result, slo))
    table = pd.DataFrame(rows)
    if objective not in table:
        raise ConfigError(
            f"unknown objective {objective!r}: use one of {', '.join(c for c in table if c != 'policy')}"
        )
    values = table[objective].astype(float)
    higher = objective in HIGHER_IS_BETTER
    here = policies.index(incumbent)
    if values.isna().all():  # nothing measured (every request failed): keep what runs
        values = values.fillna(0.0)
    best = int(values.idxmax() if higher else values.idxmin())
    winner = policies[best]
    mine, theirs = float(values[here]), float(values[best])
    margin = (theirs - mine if higher else mine - theirs) / abs(mine) * 100 if mine else 0.0
    if winner == incumbent or not margin > 0:
        winner, margin = incumbent, 0.0
    table["incumbent"] = [p == incumbent for p in policies]
    table["winner"] = [p == winner for p in policies]
    if error is None:
        return Retune(table, winner, incumbent, objective, margin)
    low, high = error_band(values, error, objective)
    table[f"{objective}_low"], table[f"{objective}_high"] = low, high
    clears = winner != incumbent and bool(low[best] > high[here] if higher else high[best] < low[here])
    return Retune(table, winner, incumbent, objective, margin, dict(error), clears)
