"""Open-loop request-rate sweeps and SLO analysis, checked against a held-out server whose
capacity is known in advance: a stub that streams one answer at a time (16 ms each, so about
60 requests/s at most). Well under that rate nearly every request meets a 50 ms TTFT; far over
it the queue grows and most miss, so the highest rate within the SLO is the one in between."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from dynamo_nb import ConfigError
from dynamo_nb.bench import (
    RECORD_COLUMNS,
    SLO,
    Chart,
    max_rate_within_slo,
    pareto_chart,
    run,
    save_csv,
    slo_attainment,
    slo_chart,
    summary,
    ttft_itl_chart,
)
from dynamo_nb.testing import StubServer

pytestmark = pytest.mark.timeout(60)

RATES = [10.0, 20.0, 400.0]  # a quarter and a third of the stub's capacity, then 6x it


async def test_a_rate_sweep_finds_the_highest_rate_within_the_slo_of_a_known_server(tmp_path: Path) -> None:
    async with await StubServer.start(ttft=0.010, itl=0.002, slots=1) as stub:
        df = await run(stub.url, "stub", rate=RATES, requests=30, max_tokens=4, progress=False, seed=3)
    assert list(df.columns) == RECORD_COLUMNS
    assert df["error"].isna().all() and sorted(df["rate"].unique()) == RATES
    assert df["concurrency"].isna().all()
    # open loop: at 400 req/s the 30 requests are all sent within a fraction of a second
    fast = df[df["rate"] == 400.0]
    assert fast["sent_s"].max() - fast["sent_s"].min() < 0.5

    slo = SLO(ttft_ms=50)
    best, table = max_rate_within_slo(df, slo, attainment=0.9)
    assert best in (10.0, 20.0), table  # 20 req/s as designed; 10 when a busy host stalls a few requests
    assert best == max(rate for rate in RATES if table.loc[rate, "within_slo"])
    assert list(table.index) == RATES and table.loc[400.0, "attainment"] < 0.5
    assert table.loc[10.0, "within_slo"] and not table.loc[400.0, "within_slo"]
    assert (table["goodput_req_per_s"] <= table["req_per_s"] + 1e-9).all()
    assert list(summary(df).index) == RATES  # the summary groups a rate sweep by rate

    for chart in (pareto_chart(df), ttft_itl_chart(df), slo_chart(df, slo)):
        assert isinstance(chart, Chart) and chart.to_png().startswith(b"\x89PNG")
        assert all(ax.get_title() for ax in chart.axes)
    # the SLO chart: TTFT p90 bars against the limit, then the share within it; misses in red
    latency_ax, share_ax = slo_chart(df, slo).axes
    red = (0.8392156862745098, 0.15294117647058825, 0.1568627450980392, 1.0)  # matplotlib's tab:red
    missed = [patch.get_facecolor() == red for patch in share_ax.patches]
    assert missed == [not ok for ok in table["within_slo"]]
    assert [t.get_text() for t in latency_ax.get_xticklabels()] == ["10 req/s", "20 req/s", "400 req/s"]
    path = save_csv(df, tmp_path / "sweep.csv")
    back = pd.read_csv(path)
    assert len(back) == len(df) and {"time_to_first_token_ms", "inter_token_latency_ms", "rate"} <= set(
        back.columns
    )
    assert math.isclose(back["time_to_first_token_ms"].iloc[0], df["ttft_s"].iloc[0] * 1000.0)


async def test_slo_limits_and_goodput_per_concurrency_level() -> None:
    async with await StubServer.start(ttft=0.005, itl=0.002) as stub:
        df = await run(stub.url, "stub", concurrency=[1, 2], requests=6, max_tokens=3, progress=False)
    met_all = slo_attainment(df, SLO(ttft_ms=1000, itl_ms=1000, e2e_ms=1000))
    assert list(met_all.index) == [1, 2] and (met_all["attainment"] == 1.0).all()
    met_none = slo_attainment(df, SLO(ttft_ms=0.001))
    assert (met_none["attainment"] == 0.0).all() and (met_none["goodput_req_per_s"] == 0.0).all()
    best, _table = max_rate_within_slo(df, SLO(ttft_ms=0.001))
    assert best is None
    with pytest.raises(ConfigError, match="at least one limit"):
        SLO()
    with pytest.raises(ConfigError, match="positive number of milliseconds"):
        SLO(ttft_ms=-1)
    with pytest.raises(ConfigError, match="rate must be a positive number"):
        await run("http://127.0.0.1:9", "stub", rate=[0], progress=False)


def one_server_queue(rate: float, requests: int, service_s: float) -> pd.DataFrame:
    """Records of a server that answers one request at a time in ``service_s``, sent requests at
    an even ``rate``: it keeps up below 1 / service_s and its queue grows above."""
    rows, free = [], 0.0
    for index in range(requests):
        sent = index / rate
        free = max(sent, free) + service_s
        rows.append({"label": "", "rate": rate, "index": index, "prompt": "p", "sent_s": sent,
                     "ttft_s": free - sent, "e2e_s": free - sent, "itl_s": [], "output_tokens": 1,
                     "input_tokens": 1, "status": 200})  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=RECORD_COLUMNS)


def test_a_saturated_rate_is_flagged_and_never_the_answer() -> None:
    """Capacity 50 req/s: at 200 req/s the queue grows, so even an SLO loose enough to call most of
    its requests good does not make it the answer; the table shows achieved against offered."""
    df = pd.concat([one_server_queue(rate, 400, 0.02) for rate in (20.0, 40.0, 200.0)], ignore_index=True)
    best, table = max_rate_within_slo(df, SLO(ttft_ms=10_000), attainment=0.9)
    assert table["attainment"].eq(1.0).all()  # every request within 10 s, even the saturated ones
    assert table["keeps_up"].tolist() == [True, True, False]
    assert table.loc[200.0, "offered_req_per_s"] == pytest.approx(200, rel=0.02)
    assert table.loc[200.0, "achieved_req_per_s"] == pytest.approx(50, rel=0.05)
    assert table.loc[40.0, "achieved_req_per_s"] == pytest.approx(40, rel=0.05)
    assert best == 40.0 and not table.loc[200.0, "within_slo"]
