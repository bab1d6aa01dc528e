"""`replay.fidelity`: a replay per timing model set beside the run it predicts, each figure with its
error. A "live" run here is a replay too (so the expected errors are known exactly): the same
model gives 0 % everywhere, Dynamo's curves against a profiled engine's run do not."""

from __future__ import annotations

import pytest

from dynamo_nb import bench
from dynamo_nb.engines.mocker_timing import TimingProfile
from dynamo_nb.errors import ConfigError
from dynamo_nb.replay import FIGURES, Fleet, MockerSettings, fidelity, replay

FAST_ENGINE = TimingProfile(
    prefill=[(t, 0.01 * t + 2) for t in (16, 64, 256, 1024)],
    decode=[(b, c, 0.8 + 0.1 * b + 0.0005 * b * c) for b in (1, 4, 16) for c in (50.0, 400.0)],
)


def test_the_model_that_made_a_run_predicts_it_exactly_and_another_does_not(tmp_path) -> None:
    trace = bench.synthetic_trace(60, rate=20.0, prefix_blocks=2, output_length=16, block_size=16, seed=2)
    profiled = MockerSettings(block_size=16, planner_profile_data=str(FAST_ENGINE.write(tmp_path / "fast")))
    fleet = Fleet(workers=2, router="kv")
    live = replay(trace, fleet, profiled).requests
    table = fidelity(trace, live, {"profiled": profiled, "Dynamo's curves": MockerSettings(block_size=16)},
                     fleet=fleet)  # fmt: skip
    assert set(table["figure"]) == {*FIGURES, "ttft_mape_pct"} and set(table["model"]) == {
        "profiled",
        "Dynamo's curves",
    }
    same = table[table["model"] == "profiled"].set_index("figure")["error_pct"]
    assert (same.abs() < 1e-9).all(), same
    other = table[table["model"] == "Dynamo's curves"].set_index("figure")["error_pct"]
    assert other["ttft_p50_ms"] > 100 and other["ttft_mape_pct"] > 100, other  # its curves are a slower GPU's


def test_a_live_run_of_another_trace_or_no_model_is_refused() -> None:
    trace = bench.synthetic_trace(10, rate=5.0, seed=1)
    live = replay(trace).requests
    with pytest.raises(ConfigError, match="compare a trace with its own run"):
        fidelity(bench.synthetic_trace(12, rate=5.0, seed=1), live, {"default": MockerSettings()})
    with pytest.raises(ConfigError, match="at least one timing model"):
        fidelity(trace, live, {})


def test_a_fleets_overhead_is_added_to_every_requests_ttft_and_end() -> None:
    trace = bench.synthetic_trace(20, rate=10.0, output_length=8, seed=4)
    plain = replay(trace, Fleet(workers=1)).requests
    with_overhead = replay(trace, Fleet(workers=1, overhead_ms=5.0)).requests
    assert ((with_overhead["ttft_s"] - plain["ttft_s"]).round(9) == 0.005).all()
    assert ((with_overhead["e2e_s"] - plain["e2e_s"]).round(9) == 0.005).all()
    with pytest.raises(ConfigError, match="overhead_ms must be 0 or more"):
        Fleet(overhead_ms=-1)
