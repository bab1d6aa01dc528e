"""How far a replay is from the live run it predicts: `fidelity` replays a trace with each timing
model and sets every figure beside the live run's, with its error.

One row per timing model and figure: TTFT p50 and p90, inter-token latency p50 and p90 (ms; as
aiperf and genai-perf count it, per request: ``(end − first token) / (output tokens − 1)``, the
percentiles over the requests — the gaps pooled over all tokens have a median that jumps between
the batch sizes a load mixes), output tokens per second, and the mean of each request's TTFT error (MAPE: each request replayed
is matched with the same request live, by its place in the trace). ``error_pct`` is
``100 · (replay − live) / live``: positive when the replay predicts slower than it was.
``again``, a second live run of the same requests (`bench.unseen_blocks` of the trace, so nothing
is cached from the first), adds the rows of model ``"live again"``: how far two live runs are
apart, the noise no timing model can beat.

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

__all__ = ["FIGURES", "error_band", "error_band_pct", "fidelity", "model_error"]

FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms", "output_tok_per_s")
"""The figures of `bench.summary` a fidelity table compares (and ``ttft_mape_pct``, per request)."""


def fidelity(
    trace: pd.DataFrame,
    live: pd.DataFrame,
    models: Mapping[str, MockerSettings],
    *,
    fleet: Fleet | None = None,
    seed: int = 0,
    again: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Replay ``trace`` on ``fleet`` once per timing model in ``models`` (name → the mocker's
    settings) and compare each with ``live``, the same trace's records from a live run
    (`bench.run_trace`); see the module docstring for the columns.

    Raises:
        ConfigError: ``live`` is not a run of ``trace`` (another number of requests), or no model.
    """
    import pandas as pd

    if not models:
        raise ConfigError("fidelity needs at least one timing model: {'name': MockerSettings(...)}")
    for run in (live, again):
        if run is not None and len(run) != len(trace):
            raise ConfigError(
                f"the live run has {len(run)} requests and the trace {len(trace)}: compare a trace with its own "
                "run (bench.run_trace)"
            )
    measured = _figures(live)
    live_ttft = live.set_index("index")["ttft_s"]
    predictions = {
        name: replay(trace, fleet, settings, seed=seed).requests for name, settings in models.items()
    }
    if again is not None:
        predictions["live again"] = again
    rows: list[dict[str, Any]] = []
    for name, predicted_run in predictions.items():
        predicted = _figures(predicted_run)
        for figure in FIGURES:
            rows.append(_row(name, figure, float(predicted[figure]), float(measured[figure])))
        ttft = predicted_run.set_index("index")["ttft_s"]
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


def _figures(run: pd.DataFrame) -> dict[str, float]:
    """A run's `FIGURES`: TTFT and throughput as `bench.summary` has them, ITL per request."""
    from ..bench.stats import level_summary

    figures = {name: float(value) for name, value in level_summary(run).items() if name in FIGURES}
    ok = run[run["error"].isna() & (run["output_tokens"].fillna(0) > 1)]
    itl_ms = 1000.0 * (ok["e2e_s"] - ok["ttft_s"]) / (ok["output_tokens"] - 1)
    for q in (50, 90):
        figures[f"itl_p{q}_ms"] = float(itl_ms.quantile(q / 100)) if len(itl_ms) else math.nan
    return figures


def _row(model: str, figure: str, predicted: float, measured: float) -> dict[str, Any]:
    error = 100.0 * (predicted - measured) / measured if measured else math.nan
    return {"model": model, "figure": figure, "replay": predicted, "live": measured, "error_pct": error}


def model_error(table: pd.DataFrame, model: str) -> dict[str, float]:
    """One model's measured error from a `fidelity` table, figure → percent (what `planner.plan`
    and `planner.retune` take as ``error``).

    Example:
        >>> import pandas as pd
        >>> table = pd.DataFrame([{"model": "profiled", "figure": "ttft_p90_ms", "replay": 9.0, "live": 10.0,
        ...                        "error_pct": -10.0}])
        >>> model_error(table, "profiled")
        {'ttft_p90_ms': -10.0}

    Raises:
        ConfigError: the table has no rows of ``model`` (naming those it has).
    """
    rows = table[table["model"] == model]
    if rows.empty:
        raise ConfigError(f"the fidelity table has no model {model!r}: it has {sorted(set(table['model']))}")
    return {
        str(figure): float(error) for figure, error in zip(rows["figure"], rows["error_pct"], strict=True)
    }


def error_band_pct(error: Mapping[str, float], figure: str) -> float:
    """How far ``figure`` may be off, by a model's measured ``error`` (figure → percent): its own
    error's size, or for another figure of the same kind (``ttft_mean_ms``, ``itl_p99_ms``) the
    largest of that kind's (``ttft_p50_ms``, ``ttft_p90_ms``); 0 where none was measured.

    Example:
        >>> error_band_pct({"ttft_p50_ms": -5.0, "ttft_p90_ms": 12.0}, "ttft_mean_ms")
        12.0
    """
    own = error.get(figure)
    if own is not None and math.isfinite(own):
        return abs(own)
    kind = figure.split("_p")[0].split("_mean")[0]
    measured = [abs(v) for key, v in error.items() if key.startswith(f"{kind}_p") and math.isfinite(v)]
    return max(measured, default=0.0)


def error_band(value: Any, error: Mapping[str, float], figure: str) -> tuple[Any, Any]:
    """``value`` (a number, or a column of them) of ``figure`` ± its measured error
    (`error_band_pct`): ``(low, high)``.

    Example:
        >>> error_band(50.0, {"ttft_p90_ms": -20.0}, "ttft_p90_ms")
        (40.0, 60.0)
    """
    band = error_band_pct(error, figure) / 100.0
    return value * (1 - band), value * (1 + band)
