"""Charts stay readable with the data shapes the notebooks give them: no overlapping x labels,
no legend over bars or lines, one bar per worker on its own tick. `layout_problems` is the check;
the last test shows it fails on a chart drawn badly on purpose."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dynamo_nb.bench import SLO, layout_problems, per_worker_chart, slo_chart, ttft_itl_chart
from dynamo_nb.bench.http_client import RECORD_COLUMNS


def records(label: str, workers: list[str], n: int, ttft: float, **level: float) -> pd.DataFrame:
    rng = np.random.default_rng(len(label) * 7 + n)
    rows = []
    for i in range(n):
        first = float(rng.gamma(4.0, ttft / 4.0))
        row = dict.fromkeys(RECORD_COLUMNS)
        row.update(label=label, index=i, prompt=f"p{i % 8}", worker=workers[i % len(workers)], ttft_s=first,
                   e2e_s=first + 0.2, itl_s=[0.01] * 15, output_tokens=16, input_tokens=40, status=200,
                   sent_s=i * 0.01, **level)  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def fleet(prefix: str, size: int) -> list[str]:
    return [f"7587{prefix}{i:06x}" for i in range(size)]  # instance ids that share a long prefix


def test_slo_chart_of_fleets_at_one_concurrency_names_each_bar_once() -> None:
    # notebook 09's capacity plan: four fleets, each at concurrency 200
    plan = pd.concat(
        [records(f"{n} workers", fleet("a", n), 400, 1.6 / n, concurrency=200) for n in (1, 2, 3, 4)],
        ignore_index=True,
    )
    chart = slo_chart(plan, SLO(ttft_ms=500))
    assert layout_problems(chart) == []
    assert [t.get_text() for t in chart.axes[0].get_xticklabels()] == [f"{n} workers" for n in (1, 2, 3, 4)]
    assert "concurrency 200" in chart._suptitle.get_text()


def test_slo_chart_of_a_rate_sweep() -> None:
    rates = pd.concat(
        [records("", fleet("b", 2), 100, 0.05 * r / 50, rate=r) for r in (50, 100, 200, 300, 400, 500)],
        ignore_index=True,
    )
    assert layout_problems(slo_chart(rates, SLO(ttft_ms=500, itl_ms=40))) == []


@pytest.mark.parametrize("labels, shared", [(("round-robin", "kv", "kv-weight-4"), False),
                                            (("round-robin", "least-loaded"), True)])  # fmt: skip
def test_per_worker_chart_puts_each_bar_on_its_tick(labels: tuple[str, ...], shared: bool) -> None:
    # notebook 06: three fleets of four engines each; notebook 04: two router modes over one fleet
    frames = [records(label, fleet("c" if shared else str(i), 4), 96, 0.03) for i, label in enumerate(labels)]
    chart = per_worker_chart(pd.concat(frames, ignore_index=True))
    assert layout_problems(chart) == []
    count_ax = chart.axes[0]
    ticks = list(count_ax.get_xticks())
    centers = [bar.get_x() + bar.get_width() / 2 for bar in count_ax.patches]
    if shared:  # side by side around each tick
        assert len(ticks) == 4 and len(centers) == 4 * len(labels)
    else:  # one bar per worker, centred on it, grouped by fleet
        assert len(ticks) == 4 * len(labels) and centers == pytest.approx(ticks)


def test_ttft_itl_chart_with_several_labels() -> None:
    frames = [
        records(label, fleet("d", 2), 32, 0.05 * c, concurrency=c)
        for label in ("a", "b")
        for c in (1, 2, 4, 8, 16)
    ]
    assert layout_problems(ttft_itl_chart(pd.concat(frames, ignore_index=True))) == []


def test_the_check_finds_what_makes_a_chart_unreadable() -> None:
    figure = Figure(figsize=(4, 3))
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    ax.bar(range(6), [5, 5, 5, 5, 5, 5], label="requests")
    ax.set_xticks(range(6), [f"{n} workers · concurrency 200" for n in range(6)])
    ax.axhline(4, label="target")
    ax.legend(loc="lower left")
    ax.set_title("a title far too long for a figure four inches wide, so its ends are cut by the edges")
    problems = layout_problems(figure)
    assert any("overlap" in p for p in problems) and any("legend covers" in p for p in problems), problems
    assert any("is cut by the figure's edge" in p and p.startswith("'a title") for p in problems), problems
