"""`replay.fidelity`: a replay per timing model set beside the run it predicts, each figure with its
error. A "live" run here is a replay too (so the expected errors are known exactly): the same
model gives 0 % everywhere, Dynamo's curves against a profiled engine's run do not."""

from __future__ import annotations

import pytest

from dynamo_nb import bench
from dynamo_nb.engines.mocker_timing import TimingProfile
from dynamo_nb.errors import ConfigError
from dynamo_nb.replay import FIGURES, Fleet, MockerSettings, fidelity, model_error, replay

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


def test_a_second_live_run_is_set_beside_as_the_noise_floor() -> None:
    """``again``: another run of the same requests, compared like a model (here a replay at
    another fleet's overhead, so its error is known)."""
    trace = bench.synthetic_trace(20, rate=10.0, output_length=8, seed=4)
    live = replay(trace, Fleet(workers=1)).requests
    again = replay(trace, Fleet(workers=1, overhead_ms=1000.0)).requests
    table = fidelity(trace, live, {"default": MockerSettings()}, fleet=Fleet(workers=1), again=again)
    noise = table[table["model"] == "live again"].set_index("figure")
    assert noise.loc["ttft_p50_ms", "replay"] == pytest.approx(noise.loc["ttft_p50_ms", "live"] + 1000.0)
    assert noise.loc["itl_p50_ms", "error_pct"] == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="compare a trace with its own run"):
        fidelity(trace, live, {"default": MockerSettings()}, again=again.head(5))


def test_unseen_blocks_keep_a_traces_sharing_and_share_nothing_with_other_runs() -> None:
    trace = bench.synthetic_trace(30, rate=10.0, prefix_groups=2, prefix_blocks=3, seed=5)
    first, second = bench.unseen_blocks(trace, 1), bench.unseen_blocks(trace, 2)
    blocks = [{block for ids in run["hash_ids"] for block in ids} for run in (trace, first, second)]
    assert not (blocks[0] & blocks[1]) and not (blocks[1] & blocks[2]) and not (blocks[0] & blocks[2])
    assert [len(ids) for ids in first["hash_ids"]] == [len(ids) for ids in trace["hash_ids"]]
    # the same requests share the same prefixes
    assert first["hash_ids"].map(lambda ids: tuple(ids[:3])).nunique() == 2 == trace["group"].nunique()
    with pytest.raises(ConfigError, match="number the runs from 1"):
        bench.unseen_blocks(trace, 0)


def test_a_models_error_is_read_from_the_table_by_name() -> None:
    trace = bench.synthetic_trace(20, rate=10.0, output_length=8, seed=4)
    live = replay(trace, Fleet(workers=1)).requests
    table = fidelity(trace, live, {"default": MockerSettings()}, fleet=Fleet(workers=1))
    error = model_error(table, "default")
    assert set(error) == {*FIGURES, "ttft_mape_pct"} and error["ttft_p50_ms"] == pytest.approx(0.0)
    with pytest.raises(ConfigError, match=r"no model 'profiled': it has \['default'\]"):
        model_error(table, "profiled")
