"""How far a replay is from the live run it predicts: `fidelity` replays a trace with each timing
model and sets every figure beside the live run's, with its error.

One row per timing model and figure: TTFT p50 and p90, inter-token latency p50 and p90 (ms),
output tokens per second, and the mean of each request's TTFT error (MAPE: each request replayed
is matched with the same request live, by its place in the trace). ``error_pct`` is
``100 · (replay − live) / live``: positive when the replay predicts slower than it was.

Example::

    live = await bench.run_trace(url, "tiny-llama", trace)
    measured = await bench.profile(url, "tiny-llama")
    table = fidelity(trace, live, {"Dynamo's curves": MockerSettings(),
                                   "profiled": MockerSettings(planner_profile_data=measured.write("p"))})
    table.pivot(index="figure", columns="model", values="error_pct")
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .fleet import Fleet, MockerSettings
from .simulator import replay

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FIGURES", "fidelity"]

FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms", "output_tok_per_s")
"""The figures of `bench.summary` a fidelity table compares (and ``ttft_mape_pct``, per request)."""


def fidelity(
    trace: pd.DataFrame,
    live: pd.DataFrame,
    models: Mapping[str, MockerSettings],
    *,
    fleet: Fleet | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Replay ``trace`` on ``fleet`` once per timing model in ``models`` (name → the mocker's
    settings) and compare each with ``live``, the same trace's records from a live run
    (`bench.run_trace`); see the module docstring for the columns.

    Raises:
        ConfigError: ``live`` is not a run of ``trace`` (another number of requests), or no model.
    """
    import pandas as pd

    from ..bench.stats import level_summary

    if not models:
        raise ConfigError("fidelity needs at least one timing model: {'name': MockerSettings(...)}")
    if len(live) != len(trace):
        raise ConfigError(
            f"the live run has {len(live)} requests and the trace {len(trace)}: compare a trace with its own run "
            "(bench.run_trace)"
        )
    measured = level_summary(live)
    live_ttft = live.set_index("index")["ttft_s"]
    rows: list[dict[str, Any]] = []
    for name, settings in models.items():
        replayed = replay(trace, fleet, settings, seed=seed).requests
        predicted = level_summary(replayed)
        for figure in FIGURES:
            rows.append(_row(name, figure, float(predicted[figure]), float(measured[figure])))
        ttft = replayed.set_index("index")["ttft_s"]
        both = pd.concat([ttft.rename("replay"), live_ttft.rename("live")], axis=1).dropna()
        both = both[both["live"] > 0]
        mape = (
            float((100.0 * (both["replay"] - both["live"]).abs() / both["live"]).mean())
            if len(both)
            else math.nan
        )
        rows.append(
            {"model": name, "figure": "ttft_mape_pct", "replay": mape, "live": math.nan, "error_pct": mape}
        )
    return pd.DataFrame(rows)


def _row(model: str, figure: str, predicted: float, measured: float) -> dict[str, Any]:
    error = 100.0 * (predicted - measured) / measured if measured else math.nan
    return {"model": model, "figure": figure, "replay": predicted, "live": measured, "error_pct": error}
