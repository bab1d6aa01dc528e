"""The planner: the fewest workers (or prefill:decode split) that meet an SLO, on a known
capacity model and on replays; the autoscaler's hysteresis and bounds on given metrics, and on
a running graph of mocker workers under a load step up and down."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pandas as pd
import pytest

from dynamo_nb import bench
from dynamo_nb.errors import ConfigError
from dynamo_nb.planner import Autoscaler, plan
from dynamo_nb.replay import Fleet, MockerSettings, ReplayResult, replay

pytestmark = pytest.mark.timeout(120)

TRACE = bench.synthetic_trace(50, rate=10.0, output_length=11, seed=3)


def stub_capacity(ttft_s: Any, itl_s: Any) -> Any:
    """A capacity model: every request's TTFT and gaps as functions of the fleet, 1 h of traffic."""

    def simulate(trace: pd.DataFrame, fleet: Fleet, settings: MockerSettings, *, seed: int) -> ReplayResult:
        rows = []
        for index, (inputs, outputs) in enumerate(
            zip(trace["input_length"], trace["output_length"], strict=True)
        ):
            row = dict.fromkeys(bench.RECORD_COLUMNS)
            ttft, gap = ttft_s(fleet), itl_s(fleet)
            row.update(index=index, rate=1.0, sent_s=float(index), ttft_s=ttft, itl_s=[gap] * (outputs - 1),
                       e2e_s=ttft + gap * (outputs - 1), input_tokens=inputs, output_tokens=outputs)  # fmt: skip
            rows.append(row)
        busy = {"prefill": 1.0, "decode": 3.0}
        return ReplayResult(pd.DataFrame(rows), fleet, settings, 3600.0, 0.01, 1, busy)

    return simulate


def test_the_planner_answers_the_fewest_workers_of_a_known_capacity() -> None:
    simulate = stub_capacity(lambda f: 0.4 / f.workers, lambda f: 0.05 / f.workers)
    answer = plan(TRACE, bench.SLO(ttft_ms=150, itl_ms=20), simulate=simulate, max_workers=8)
    assert answer.fleet == Fleet(workers=3)
    assert answer.table["workers"].tolist() == [1, 2, 3, 4]  # one size past the answer, for the table
    assert answer.table["meets"].tolist() == [False, False, True, True]
    assert answer.table.loc[answer.table["chosen"], "workers"].tolist() == [3]
    assert answer.table["ttft_p90_ms"].tolist() == pytest.approx([400, 200, 400 / 3, 100])
    assert answer.table["attainment"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert "3 workers" in repr(answer)


def test_a_disaggregated_plan_finds_the_split_and_prices_each_pool_on_its_tokens() -> None:
    simulate = stub_capacity(lambda f: 0.3 / f.prefill, lambda f: 0.06 / f.decode)
    answer = plan(TRACE, bench.SLO(ttft_ms=160, itl_ms=25), disaggregated=True, simulate=simulate,
                  max_workers=8, price_per_worker_hour=2.0)  # fmt: skip
    assert answer.fleet == Fleet(prefill=2, decode=3)
    assert set(answer.table["workers"]) == {2, 3, 4, 5, 6}
    chosen = answer.table[answer.table["chosen"]].iloc[0]
    inputs, outputs = TRACE["input_length"].sum(), TRACE["output_length"].sum()
    assert chosen["cost_per_m_input"] == pytest.approx(2 * 2.0 / inputs * 1e6)  # 2 prefill workers, 1 h
    assert chosen["cost_per_m_output"] == pytest.approx(3 * 2.0 / outputs * 1e6)
    assert answer.chart().to_png()[:4] == b"\x89PNG"


def test_a_plan_given_its_models_error_shows_the_band_and_the_fleet_that_meets_within_it() -> None:
    """TTFT p90 400/workers ms against 150: 3 workers meet it as predicted (133 ms), but at the
    measured error of 20 % the band's top (160 ms) does not; 4 (100, top 120) does."""
    simulate = stub_capacity(lambda f: 0.4 / f.workers, lambda f: 0.05 / f.workers)
    error = {"ttft_p50_ms": -5.0, "ttft_p90_ms": -20.0, "itl_p50_ms": 10.0, "itl_p90_ms": -3.0}
    answer = plan(TRACE, bench.SLO(ttft_ms=150, itl_ms=20), simulate=simulate, max_workers=8, error=error)
    assert answer.fleet == Fleet(workers=3) and answer.fleet_within_error == Fleet(workers=4)
    table = answer.table.set_index("workers")
    assert table.loc[3, "ttft_p90_ms_high"] == pytest.approx(400 / 3 * 1.2)
    assert table.loc[3, "ttft_p90_ms_low"] == pytest.approx(400 / 3 * 0.8)
    assert table.loc[3, "itl_p90_ms_high"] == pytest.approx(50 / 3 * 1.03)  # its own figure's error
    assert table["meets_within_error"].tolist() == [False, False, False, True]
    assert "TTFT ±20 %" in repr(answer) and "within it, 4 workers" in repr(answer)
    assert answer.chart().to_png()[:4] == b"\x89PNG"
    at_p99 = plan(TRACE, bench.SLO(ttft_ms=150), simulate=simulate, percentile=99, error=error)
    assert "TTFT ±20 %" in repr(at_p99)  # no p99 measured: the larger of p50's and p90's
    assert "model error not measured" in repr(plan(TRACE, bench.SLO(ttft_ms=150), simulate=simulate))


def test_a_disaggregated_plan_within_error_is_a_split() -> None:
    simulate = stub_capacity(lambda f: 0.3 / f.prefill, lambda f: 0.06 / f.decode)
    answer = plan(TRACE, bench.SLO(ttft_ms=160, itl_ms=25), disaggregated=True, simulate=simulate,
                  max_workers=8, error={"ttft_p90_ms": 10.0, "itl_p90_ms": 25.0})  # fmt: skip
    assert answer.fleet == Fleet(prefill=2, decode=3)
    # 150 ms TTFT at 2 prefill workers is 165 at the band's top (3 take it to 110), 20 ms ITL at
    # 3 decode workers is 25 at its top, still within the SLO
    assert answer.fleet_within_error == Fleet(prefill=3, decode=3)
    assert answer.table["workers"].max() == 6  # searched on until a size meets it within the error


def test_an_aggregated_plan_splits_cost_by_what_the_engines_spent_time_on() -> None:
    simulate = stub_capacity(lambda f: 0.1, lambda f: 0.01)
    answer = plan(TRACE, bench.SLO(ttft_ms=500), simulate=simulate, price_per_worker_hour=4.0)
    first = answer.table.iloc[0]
    assert first["cost_per_m_input"] == pytest.approx(4.0 * 0.25 / TRACE["input_length"].sum() * 1e6)
    assert first["cost_per_m_output"] == pytest.approx(4.0 * 0.75 / TRACE["output_length"].sum() * 1e6)


def test_when_no_fleet_meets_the_slo_the_plan_says_so() -> None:
    simulate = stub_capacity(lambda f: 1.0, lambda f: 0.01)
    answer = plan(TRACE, bench.SLO(ttft_ms=100), simulate=simulate, max_workers=3)
    assert answer.fleet is None and len(answer.table) == 3 and not answer.table["chosen"].any()
    assert "no fleet tried meets it" in repr(answer)
    with pytest.raises(ConfigError, match="percentile"):
        plan(TRACE, bench.SLO(ttft_ms=100), percentile=0)
    with pytest.raises(ConfigError, match="max_workers must be at least 2"):
        plan(TRACE, bench.SLO(ttft_ms=100), disaggregated=True, max_workers=1)


def test_a_replayed_plan_answers_a_fleet_whose_replay_meets_the_slo() -> None:
    trace = bench.synthetic_trace(300, rate=60.0, output_length=32, seed=1)
    slo = bench.SLO(ttft_ms=40, itl_ms=12)
    answer = plan(trace, slo, max_workers=6)
    assert answer.fleet is not None
    chosen = replay(trace, answer.fleet).requests
    smaller = replay(trace, Fleet(workers=answer.fleet.workers - 1)).requests
    p90 = lambda df: (df["ttft_s"].quantile(0.9) * 1000, bench.stats.mean_gaps_s(df).quantile(0.9) * 1000)  # noqa: E731
    assert p90(chosen)[0] <= 40 and p90(chosen)[1] <= 12
    assert p90(smaller)[0] > 40 or p90(smaller)[1] > 12


class _Graph:
    """Records what the autoscaler asks of a running graph."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def scale(self, service: str, replicas: int) -> None:
        assert service == "worker"
        self.calls.append(replicas)


def _metrics(
    inflight: float, answered: float, ttft_buckets: dict[float, float] | None = None
) -> pd.DataFrame:
    text = f'# TYPE dynamo_frontend_inflight_requests gauge\ndynamo_frontend_inflight_requests{{model="m"}} {inflight}\n'
    text += (
        f'# TYPE dynamo_frontend_requests counter\ndynamo_frontend_requests_total{{model="m"}} {answered}\n'
    )
    if ttft_buckets:
        text += "# TYPE dynamo_frontend_time_to_first_token_seconds histogram\n"
        for le, count in ttft_buckets.items():
            bound = "+Inf" if math.isinf(le) else f"{le}"
            text += f'dynamo_frontend_time_to_first_token_seconds_bucket{{model="m",le="{bound}"}} {count}\n'
    return bench.parse_metrics(text)


class _Scripted(Autoscaler):
    """An autoscaler that reads the given metrics in turn instead of scraping a frontend."""

    def __init__(self, frames: list[pd.DataFrame], **kwargs: Any) -> None:
        super().__init__(_Graph(), "worker", "http://127.0.0.1:1", **kwargs)
        self.frames = frames

    async def _scrape(self) -> pd.DataFrame:
        return self.frames.pop(0)


async def test_the_autoscaler_goes_up_at_once_down_one_at_a_time_within_its_bounds() -> None:
    inflight = [0, 30, 30, 4, 0, 0, 0, 0, 0, 0, 0]
    scaler = _Scripted([_metrics(n, 10 * i) for i, n in enumerate(inflight)], mode="load", target=4,
                       replicas=1, min_replicas=1, max_replicas=5, down_after=2)  # fmt: skip
    scaler._previous = await scaler._scrape()
    for _ in inflight[1:]:
        await scaler.step()
    table = scaler.decisions
    assert scaler.running.calls == [5, 4, 3, 2, 1]  # type: ignore[attr-defined]
    assert table["desired"].tolist() == [5, 5, 1, 1, 1, 1, 1, 1, 1, 1]  # 30 in flight wants 8: bounded at 5
    assert table["action"].tolist() == [
        "up",
        "hold",
        "hold",
        "down",
        "hold",
        "down",
        "hold",
        "down",
        "hold",
        "down",
    ]
    assert table["replicas"].min() >= 1 and table["replicas"].max() <= 5


async def test_a_stop_mid_decision_lets_it_finish_and_the_live_chart_ends_on_it() -> None:
    """Stopped while a scale is under way (a notebook stops the scaler as soon as the replicas it
    waits for are reached), the decision finishes and the live chart's last frame shows it."""
    entered, gate = asyncio.Event(), asyncio.Event()

    class _SlowGraph(_Graph):
        async def scale(self, service: str, replicas: int) -> None:
            entered.set()
            await gate.wait()
            await super().scale(service, replicas)

    frames = [_metrics(0, 0), _metrics(2, 10), _metrics(30, 20)]  # a baseline, a hold, then up
    scaler = _Scripted(frames, mode="load", target=4, replicas=1, min_replicas=1, max_replicas=5,
                       interval=0.01, live=True)  # fmt: skip
    scaler.running = _SlowGraph()
    await scaler.start()
    await asyncio.wait_for(entered.wait(), 30)
    loop = scaler._task
    assert loop is not None
    stopping = asyncio.create_task(scaler.stop())
    await asyncio.wait_for(asyncio.wait([loop]), 30)  # the stop has ended the loop; the scale still waits
    assert not stopping.done()
    gate.set()
    await asyncio.wait_for(stopping, 30)
    assert scaler.running.calls == [5]  # type: ignore[attr-defined]
    assert scaler.decisions["action"].tolist() == ["hold", "up"]
    assert scaler.drawn_decisions == len(scaler.records) == 2


async def test_throughput_and_slo_modes_follow_their_signals() -> None:
    rates = [0, 10, 30, 50]  # answered requests, cumulative: 10, 20, 20 req/s at interval 1
    ticks = iter(range(1, 100))
    scaler = _Scripted([_metrics(0, n) for n in rates], mode="throughput", target=8, replicas=1,
                       max_replicas=4, clock=lambda: float(next(ticks)))  # fmt: skip
    scaler._previous, scaler._previous_at = await scaler._scrape(), 0.0
    rows = [await scaler.step() for _ in rates[1:]]
    assert [row["req_per_s"] for row in rows] == [10, 20, 20]
    assert [row["desired"] for row in rows] == [2, 3, 3] and scaler.running.calls == [2, 3]  # type: ignore[attr-defined]
    slow = _metrics(1, 1, {0.1: 0, 0.5: 10, math.inf: 10})
    fast = _metrics(1, 1, {0.1: 20, 0.5: 20, math.inf: 20})
    slo = _Scripted([_metrics(0, 0), slow, fast], mode="slo", slo=bench.SLO(ttft_ms=200), replicas=2,
                    max_replicas=4, down_after=1)  # fmt: skip
    slo._previous = await slo._scrape()
    over, under = await slo.step(), await slo.step()
    assert over["action"] == "up" and over["replicas"] == 3 and "ttft_p90_ms" in over["reason"]
    assert under["action"] == "down" and under["replicas"] == 2  # 10 fast answers: p90 under half the limit
    with pytest.raises(ConfigError, match="needs target"):
        Autoscaler(_Graph(), "worker", "http://x", mode="load")
    with pytest.raises(ConfigError, match="needs slo"):
        Autoscaler(_Graph(), "worker", "http://x", mode="slo")
    with pytest.raises(ConfigError, match="min_replicas <= max_replicas"):
        Autoscaler(_Graph(), "worker", "http://x", target=1, min_replicas=3, max_replicas=2)


GRAPH = {
    "name": "autoscale",
    "services": {"etcd": "local", "nats": "local"},
    "components": {
        "mocker": {
            "component": "components/mocker_worker.py",
            "flags": {"num-workers": 1, "max-num-seqs": 4, "log-level": "WARNING"},
        },
        "frontend": {
            "component": "components/frontend.py",
            "flags": {"http-port": 0, "router-mode": "least-loaded", "log-level": "WARNING"},
            "depends_on": ["mocker"],
        },
    },
}


@pytest.mark.processes
@pytest.mark.long  # ~15 s of a load step on processes: CI's second step runs it
@pytest.mark.timeout(240)
async def test_the_autoscaler_follows_a_load_step_up_and_back_down_on_mocker_workers() -> None:
    from helpers import ROOT

    from dynamo_nb.graph import Graph, serve

    running = await serve(Graph.from_dict(GRAPH), cwd=ROOT, show_logs=False)
    try:
        assert running.url is not None
        await bench.wait_for_model(running.url, "tiny-llama", instances=1, timeout=60)
        scaler = Autoscaler(running, "mocker", running.url, mode="load", target=4, min_replicas=1,
                            max_replicas=3, interval=1.0, down_after=2)  # fmt: skip
        async with scaler:
            load = await bench.run(running.url, "tiny-llama", concurrency=12, requests=120, max_tokens=48,
                                   progress=False)  # fmt: skip
            assert load["error"].isna().all(), load["error"].dropna().tolist()
            assert await scaler.wait_for(1, timeout=60)
        table = scaler.decisions
        assert table["replicas"].max() == 3 and table["replicas"].iloc[-1] == 1
        assert (table["replicas"] >= 1).all() and (table["replicas"] <= 3).all()
        assert table["action"].tolist().count("up") >= 1 and table["action"].tolist().count("down") == 2
        mockers = [row for row in running.status() if row["service"] == "mocker"]
        assert len(mockers) == 1 and mockers[0]["state"] == "running"
        served = load["worker"].nunique()
        assert served >= 2  # the new workers took requests while the step lasted
    finally:
        await running.stop()
