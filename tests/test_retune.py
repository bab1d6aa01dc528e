"""`planner.retune`: a grid of the KV router's knobs replayed on a trace, the best policy and its
margin over the running one; deterministic per seed; a window of the trace alone."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from dynamo_nb.bench import SLO, synthetic_trace
from dynamo_nb.errors import ConfigError
from dynamo_nb.planner import retune
from dynamo_nb.planner.retune import describe, last_window
from dynamo_nb.replay import Fleet, ReplayResult, replay
from dynamo_nb.router.policy import RouterPolicy

TRACE = synthetic_trace(300, rate=60.0, prefix_groups=8, prefix_blocks=12, seed=5)
GRID = {"prefill_load_scale": [1, 8, 32], "overlap_score_credit": [0, 1]}


def test_retune_replays_every_point_and_is_deterministic_per_seed() -> None:
    first = retune(TRACE, GRID, fleet=Fleet(workers=3), seed=1)
    again = retune(TRACE, GRID, fleet=Fleet(workers=3), seed=1)
    columns = [c for c in first.table if c != "policy"]
    pd.testing.assert_frame_equal(first.table[columns], again.table[columns])
    assert len(first.table) == 6 and first.table["incumbent"].sum() == 1
    best = first.table["ttft_mean_ms"].idxmin()
    assert first.table.loc[best, "policy"] == first.winner and bool(first.table.loc[best, "winner"])
    incumbent_ttft = float(first.table.loc[first.table["incumbent"], "ttft_mean_ms"].iloc[0])
    expected = (incumbent_ttft - first.table.loc[best, "ttft_mean_ms"]) / incumbent_ttft * 100
    assert first.margin_pct == pytest.approx(expected)
    blind = first.table[first.table["overlap_score_credit"] == 0]["reuse"]
    seeing = first.table[first.table["overlap_score_credit"] == 1]["reuse"]
    assert blind.max() < seeing.min()  # ignoring the caches reuses less of them


def scripted(ttft_ms: dict[float, float]) -> Any:
    """A simulate() whose TTFT depends only on the policy's prefill_load_scale (no replay)."""

    def simulate(trace: pd.DataFrame, fleet: Fleet, settings: Any, seed: int = 0) -> ReplayResult:
        result = replay(trace.head(5), Fleet(workers=1), settings, seed=seed)
        result.requests["ttft_s"] = ttft_ms[fleet.router_policy.prefill_load_scale] / 1000
        return result

    return simulate


def test_the_winner_and_its_margin_over_the_incumbent() -> None:
    simulate = scripted({1.0: 100.0, 8.0: 90.0, 32.0: 95.0})
    answer = retune(TRACE, {"prefill_load_scale": [8, 32]}, simulate=simulate)
    assert answer.incumbent == RouterPolicy() and len(answer.table) == 3  # the incumbent added
    assert answer.winner.prefill_load_scale == 8 and answer.margin_pct == pytest.approx(10.0)
    assert answer.beats_incumbent_by(5) and not answer.beats_incumbent_by(10)
    worse = retune(TRACE, {"prefill_load_scale": [32]}, simulate=scripted({1.0: 90.0, 32.0: 95.0}))
    assert worse.winner == worse.incumbent and worse.margin_pct == 0 and not worse.beats_incumbent_by(0)
    reused = retune(TRACE, {"prefill_load_scale": [8]}, objective="reuse", simulate=simulate)
    assert reused.objective == "reuse"  # higher is better: compared the other way round


def test_a_winner_within_the_measured_error_is_said_to_be_no_clear_win() -> None:
    """TTFT 100 ms for the incumbent, 90 for the winner: at ±3 % (the error of TTFT p90, the
    largest measured of its kind) the bands do not touch; at ±6 % they do."""
    simulate = scripted({1.0: 100.0, 8.0: 90.0})
    clear = retune(TRACE, {"prefill_load_scale": [8]}, simulate=simulate,
                   error={"ttft_p50_ms": -1.0, "ttft_p90_ms": 3.0, "itl_p50_ms": 40.0})  # fmt: skip
    assert clear.beyond_error is True and "±3 % measured error: beyond it" in repr(clear)
    assert clear.table["ttft_mean_ms_high"].tolist() == pytest.approx([103.0, 92.7])
    close = retune(TRACE, {"prefill_load_scale": [8]}, simulate=simulate, error={"ttft_p90_ms": -6.0})
    assert (
        close.beyond_error is False and "within it" in repr(close) and close.margin_pct == pytest.approx(10.0)
    )
    assert close.chart().to_png()[:4] == b"\x89PNG"
    plain = retune(TRACE, {"prefill_load_scale": [8]}, simulate=simulate)
    assert plain.beyond_error is None and "model error not measured" in repr(plain)


def test_a_window_and_bad_settings() -> None:
    window = last_window(TRACE, 2.0)
    stamps = TRACE["timestamp_ms"]
    assert 0 < len(window) < len(TRACE) and window["timestamp_ms"].min() >= stamps.max() - 2000
    answer = retune(TRACE, [RouterPolicy(prefill_load_scale=4)], window_s=2.0, fleet=Fleet(workers=2))
    assert len(answer.table) == 2
    with pytest.raises(ConfigError, match="router='kv'"):
        retune(TRACE, GRID, fleet=Fleet(workers=2, router="round-robin"))
    with pytest.raises(ConfigError, match="needs an SLO"):
        retune(TRACE, GRID, objective="goodput_req_per_s")
    with pytest.raises(ConfigError, match="unknown objective"):
        retune(TRACE, [RouterPolicy()], objective="speed")
    with pytest.raises(ConfigError, match="unknown router policy knob"):
        retune(TRACE, {"scale": [1]})
    good = retune(
        TRACE, [RouterPolicy()], objective="goodput_req_per_s", slo=SLO(ttft_ms=50), fleet=Fleet(workers=2)
    )
    assert good.table["goodput_req_per_s"].iloc[0] > 0


def test_the_retune_chart_reads_cleanly_with_many_policies() -> None:
    """Eight policies and the incumbent (notebook 14's grid): each label on its own row, the title
    inside the figure (the layout check of the kit's charts)."""
    from dynamo_nb.bench import layout_problems

    ms = {float(scale): 100.0 - scale for scale in (1, 2, 4, 8, 16, 32, 64, 128)}
    answer = retune(TRACE, {"prefill_load_scale": [2, 4, 8, 16, 32, 64, 128], "overlap_score_credit": [1.0]},
                    simulate=scripted(ms))  # fmt: skip
    chart = answer.chart()
    assert layout_problems(chart) == []
    assert [t.get_text() for t in chart.axes[0].get_yticklabels()] == [
        describe(policy) for policy in answer.table["policy"]
    ]
    assert chart.axes[0].get_xlabel() == "mean TTFT (ms)"  # the objective in words, not its column
