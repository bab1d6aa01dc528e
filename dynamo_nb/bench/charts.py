"""Charts of a `bench.run` DataFrame: each function returns a matplotlib Figure.

The figures are made without pyplot (no global state, no second copy shown at the end of
a cell); a notebook shows one as a PNG when it is a cell's value, and ``fig.savefig(path)``
writes it. Several labels in the frame (router modes, servers) become several lines.

Example::

    fig = bench.ttft_itl_chart(df)
    fig.savefig("ttft.png")
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..engines.mocker_timing import ProfiledTiming
from ..errors import ConfigError
from .slo import SLO, slo_attainment
from .stats import level_column, level_summary, median_interval, spread

__all__ = [
    "CHARTS",
    "Chart",
    "latency_cdf",
    "layout_problems",
    "pareto_chart",
    "path_chart",
    "per_worker_chart",
    "profile_chart",
    "slo_chart",
    "spread_chart",
    "throughput_chart",
    "ttft_itl_chart",
]


class Chart(Figure):
    """A Figure on the Agg canvas that a notebook displays as a PNG."""

    def to_png(self, dpi: int = 100) -> bytes:
        """The figure as PNG bytes."""
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.to_png()


def _chart(columns: int, width: float = 5.0, height: float = 3.6) -> tuple[Chart, list]:
    figure = Chart(figsize=(width * columns, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, columns, squeeze=False)[0]
    return figure, list(axes)


def _by_label(df: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    for label, group in df.groupby("label", sort=False):
        yield str(label), group


def _levels_table(df: pd.DataFrame, level: str = "concurrency") -> pd.DataFrame:
    rows = [{"level": c, **level_summary(g)} for c, g in df.groupby(level, sort=True)]
    return pd.DataFrame(rows)


def _repeat_ranges(df: pd.DataFrame, level: str, columns: list[str]) -> pd.DataFrame | None:
    """Per level, the lowest and highest of each column of `level_summary` over the frame's
    repeats (``{column}_low``, ``{column}_high``); None unless it holds two or more repeats."""
    if "repeat" not in df or df["repeat"].nunique() < 2:
        return None
    runs = pd.concat(
        [_levels_table(run.drop(columns="repeat"), level).assign(repeat=r) for r, run in df.groupby("repeat")]
    )
    ranges = runs.groupby("level")[columns].agg(["min", "max"])
    ranges.columns = [f"{column}_{'low' if how == 'min' else 'high'}" for column, how in ranges.columns]
    return ranges


def _whiskers(ax: Any, table: pd.DataFrame, ranges: pd.DataFrame | None, column: str, color: str) -> None:
    """Draw the range of ``column`` over the repeats at each level, when there are repeats."""
    if ranges is None:
        return
    middle = table.set_index("level")[column]
    low, high = ranges[f"{column}_low"].reindex(middle.index), ranges[f"{column}_high"].reindex(middle.index)
    ax.errorbar(
        middle.index,
        middle,
        yerr=[(middle - low).clip(lower=0), (high - middle).clip(lower=0)],
        fmt="none",
        ecolor=color,
        capsize=4,
        alpha=0.8,
    )


def _repeats_note(df: pd.DataFrame, drawn_on: str = "") -> str:
    """A title's second line naming the whiskers, when some label holds two or more repeats of a
    level: the number of repeats each whisker spans, or their range when labels or levels differ."""
    if "repeat" not in df or df["repeat"].nunique() < 2:
        return ""
    level = level_column(df)
    counts = df.groupby([key for key in ("label", level) if key in df])["repeat"].nunique()
    fewest, most = int(counts.min()), int(counts.max())
    on = f" on {drawn_on}" if drawn_on else ""
    over = f"{most}" if fewest == most else f"{fewest}–{most}"
    return f"\nwhisker{on}: range over {over} repeats" if most >= 2 else ""


def _concurrency_axis(ax: Any, levels: list[float], level: str = "concurrency") -> None:
    if levels and max(levels) / min(levels) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{c:g}" for c in levels])
    ax.set_xlabel("concurrency" if level == "concurrency" else "request rate (req/s)")
    ax.grid(True, alpha=0.3)


def _empty(ax: Any, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_axis_off()


def ttft_itl_chart(df: pd.DataFrame) -> Chart:
    """TTFT and inter-token latency (p50 solid, p90 dashed, p99 dotted) against concurrency
    (or request rate). Rows tagged with a ``repeat`` column (two or more runs of each level) get a
    whisker on p50 from its lowest to its highest run."""
    figure, (ttft_ax, itl_ax) = _chart(2)
    level = level_column(df)
    levels = sorted(df[level].dropna().unique().tolist()) if len(df) else []
    multi = df["label"].nunique() > 1 if len(df) else False
    for color, (label, group) in zip(_colors(), _by_label(df), strict=False):
        table = _levels_table(group, level)
        ranges = _repeat_ranges(group, level, ["ttft_p50_ms", "itl_p50_ms"])
        for ax, metric in ((ttft_ax, "ttft"), (itl_ax, "itl")):
            for p, style in ((50, "-"), (90, "--"), (99, ":")):
                name = f"{label} p{p}" if multi else f"p{p}"
                ax.plot(
                    table["level"],
                    table[f"{metric}_p{p}_ms"],
                    style,
                    marker="o",
                    color=color,
                    label=name,
                )
            _whiskers(ax, table, ranges, f"{metric}_p50_ms", color)
    note = _repeats_note(df, drawn_on="p50")
    for ax, title in ((ttft_ax, "time to first token (ms)"), (itl_ax, "inter-token latency (ms)")):
        ax.set_title(title + note)
        ax.set_ylabel("ms")
        _concurrency_axis(ax, levels, level)
        if ax.lines:
            ax.legend(fontsize="small")
    return figure


def throughput_chart(df: pd.DataFrame) -> Chart:
    """Requests/s and output tokens/s against concurrency (or request rate); with a ``repeat``
    column (two or more runs of each level), a whisker from the lowest run to the highest."""
    figure, (req_ax, tok_ax) = _chart(2)
    level = level_column(df)
    levels = sorted(df[level].dropna().unique().tolist()) if len(df) else []
    for color, (label, group) in zip(_colors(), _by_label(df), strict=False):
        table = _levels_table(group, level)
        ranges = _repeat_ranges(group, level, ["req_per_s", "output_tok_per_s"])
        req_ax.plot(table["level"], table["req_per_s"], marker="o", color=color, label=label or None)
        tok_ax.plot(table["level"], table["output_tok_per_s"], marker="o", color=color, label=label or None)
        _whiskers(req_ax, table, ranges, "req_per_s", color)
        _whiskers(tok_ax, table, ranges, "output_tok_per_s", color)
    note = _repeats_note(df)
    for ax, title, unit in (
        (req_ax, "requests per second (req/s)", "req/s"),
        (tok_ax, "output tokens per second (tok/s)", "tok/s"),
    ):
        ax.set_title(title + note)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        _concurrency_axis(ax, levels, level)
        if df["label"].nunique() > 1:
            ax.legend(fontsize="small")
    return figure


def _front(points: list[tuple[float, float]], lower_x_is_better: bool) -> list[tuple[float, float]]:
    """The Pareto-optimal points (higher y is better; x lower or higher as told), by x."""
    best = []
    for x, y in points:
        dominated = any(
            (ox <= x if lower_x_is_better else ox >= x) and oy >= y and (ox, oy) != (x, y)
            for ox, oy in points
        )
        if not dominated:
            best.append((x, y))
    return sorted(best)


def pareto_chart(df: pd.DataFrame) -> Chart:
    """A sweep's trade-offs, one point per level (the Pareto-optimal ones joined): output
    tokens/s against p90 TTFT, and tokens/s per user (a request's decode speed, median)
    against output tokens/s. Points are labelled with their level (concurrency or req/s)."""
    figure, (latency_ax, user_ax) = _chart(2)
    level = level_column(df)
    unit = "" if level == "concurrency" else "/s"
    for color, (label, group) in zip(_colors(), _by_label(df), strict=False):
        table = _levels_table(group, level)
        ok = group[group["error"].isna()]
        speeds = []
        for value in table["level"]:
            rows = ok[ok[level] == value]
            decode = (rows["e2e_s"] - rows["ttft_s"]).astype(float)
            tokens = rows["output_tokens"].astype(float) - 1
            speed = (tokens / decode)[decode > 0]
            speeds.append(float(speed.median()) if len(speed) else np.nan)
        table["tok_per_s_per_user"] = speeds
        for ax, x_name, y_name, lower_x in (
            (latency_ax, "ttft_p90_ms", "output_tok_per_s", True),
            (user_ax, "output_tok_per_s", "tok_per_s_per_user", False),
        ):
            points = [(float(x), float(y)) for x, y in zip(table[x_name], table[y_name], strict=True)
                      if np.isfinite(x) and np.isfinite(y)]  # fmt: skip
            ax.scatter([p[0] for p in points], [p[1] for p in points], color=color, label=label or None)
            front = _front(points, lower_x)
            ax.plot([p[0] for p in front], [p[1] for p in front], color=color, alpha=0.6)
            for value, x, y in zip(table["level"], table[x_name], table[y_name], strict=True):
                if np.isfinite(x) and np.isfinite(y):
                    ax.annotate(
                        f"{value:g}{unit}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 4),
                        fontsize="x-small",
                    )
    latency_ax.set_title("output tok/s against TTFT p90 (ms)")
    latency_ax.set_xlabel("TTFT p90 (ms)")
    latency_ax.set_ylabel("output tokens/s")
    user_ax.set_title("tok/s per user against output tok/s")
    user_ax.set_xlabel("output tokens/s")
    user_ax.set_ylabel("tokens/s per user")
    for ax in (latency_ax, user_ax):
        ax.grid(True, alpha=0.3)
        if df["label"].nunique() > 1:
            ax.legend(fontsize="small")
    return figure


_CDF_METRICS = {"ttft": "ttft_s", "e2e": "e2e_s", "itl": "itl_s"}


def slo_chart(df: pd.DataFrame, slo: SLO, attainment: float = 0.9) -> Chart:
    """Each level (and label) of a sweep against ``slo``: the p90 of every limited latency
    beside its limit, and the share of requests that met the SLO beside the ``attainment``
    target; bars that miss are red. The limits' legend sits under the panels, off the bars.

    Example::

        bench.slo_chart(df, bench.SLO(ttft_ms=500))
    """
    table = slo_attainment(df, slo)
    level = level_column(df)
    unit = "" if level == "concurrency" else " req/s"
    keys = list(table.index)
    shared = ""
    if keys and isinstance(keys[0], tuple) and len({key[-1] for key in keys}) == 1:
        # every label ran at one level: name bars by label, say the level once in the title
        shared = f" at {'concurrency ' if level == 'concurrency' else ''}{_row_name(keys[0][-1], unit)}"
        keys = [key[:-1] if len(key) > 2 else key[0] for key in keys]
    names = [_row_name(key, unit) for key in keys]
    limits = [
        (name, limit)
        for name, limit in (("ttft", slo.ttft_ms), ("itl", slo.itl_ms), ("e2e", slo.e2e_ms))
        if limit is not None
    ]
    figure, axes = _chart(len(limits) + 1, width=4.2)
    x = np.arange(len(names))
    for ax, (name, limit) in zip(axes, limits, strict=False):
        values = table[f"{name}_p90_ms"].astype(float).to_numpy()
        ax.bar(x, values, color=["tab:red" if v > limit else "tab:green" for v in values])
        ax.axhline(
            limit, color="black", linestyle="--", linewidth=1, label=f"{name.upper()} limit {limit:g} ms"
        )
        ax.set_title(f"{name.upper()} p90 (ms)")
        ax.set_ylabel("ms")
    share = table["attainment"].astype(float).to_numpy() * 100.0
    share_ax = axes[-1]
    share_ax.bar(x, share, color=["tab:green" if v >= attainment * 100 else "tab:red" for v in share])
    share_ax.axhline(
        attainment * 100,
        color="grey",
        linestyle=":",
        linewidth=1.5,
        label=f"target: {attainment:.0%} of requests",
    )
    share_ax.set_title("requests within the SLO (%)")
    share_ax.set_ylabel("%")
    share_ax.set_ylim(0, 105)
    for ax in axes:
        ax.set_xticks(x, names, fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    handles = [line for ax in axes for line in ax.lines]
    figure.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncols=len(handles),
                  fontsize="small")  # fmt: skip
    figure.suptitle(f"SLO: {slo}{shared}", fontsize="medium")
    _readable_ticks(figure)
    return figure


def _row_name(key: object, unit: str) -> str:
    """A summary row's name from its index key (a level, or a label and a level): "hf · 20 req/s"."""
    parts = key if isinstance(key, tuple) else (key,)
    return " · ".join(f"{part:g}{unit}" if isinstance(part, (int, float)) else str(part) for part in parts)


def latency_cdf(df: pd.DataFrame, metric: str = "ttft", tail: float | None = None) -> Chart:
    """The share of requests (of gaps, for ``itl``) at or under each latency, one line per level.

    ``tail`` (a share such as 0.95) zooms on the slowest ones: the y axis starts there and the x
    axis is logarithmic, for when the whole difference between the lines is in the last few percent.

    Example::

        bench.latency_cdf(df, "itl", tail=0.95)   # the slowest 5 % of the gaps
    """
    if metric not in _CDF_METRICS:
        raise ConfigError(f"metric must be one of {', '.join(_CDF_METRICS)}, got {metric!r}")
    if tail is not None and not 0 <= tail < 1:
        raise ConfigError(f"tail is a share from 0 to below 1 (0.95: the slowest 5 %), got {tail!r}")
    figure, (ax,) = _chart(1, width=6.0)
    column = _CDF_METRICS[metric]
    ok = df[df["error"].isna()]
    multi = df["label"].nunique() > 1 if len(df) else False
    level_name = level_column(df)
    prefix = "c=" if level_name == "concurrency" else ""
    suffix = "" if level_name == "concurrency" else " req/s"
    shown: list[tuple[float, float]] = []  # each line's lowest and highest latency in the view
    for (label, level), group in ok.groupby(["label", level_name], sort=False):
        values = group[column]
        flat = [g for gaps in values for g in gaps] if metric == "itl" else values.dropna().tolist()
        if not flat:
            continue
        xs = np.sort(np.asarray(flat, dtype=float)) * 1000.0
        ys = np.arange(1, xs.size + 1) / xs.size
        first = min(int(tail * xs.size), xs.size - 1) if tail is not None else 0  # its first step in view
        shown.append((float(xs[first]), float(xs[-1])))
        name = f"{prefix}{level:g}{suffix}"
        ax.step(xs, ys, where="post", label=f"{label} {name}" if multi else name)
    if not ax.lines:
        _empty(ax, "no successful requests")
        return figure
    ax.set_title(
        {"ttft": "time to first token", "e2e": "end-to-end latency", "itl": "inter-token latency"}[metric]
        + " CDF (ms)"
    )
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1.02)
    if tail is not None:  # the slowest (1 - tail) of them, on a log scale fitted to what is shown
        ax.set_ylim(tail, 1.002)
        ax.set_xscale("log")
        low, high = min(lo for lo, _ in shown), max(hi for _, hi in shown)
        if low > 0:
            ax.set_xlim(low / 1.25, high * 1.25)
        from matplotlib.ticker import FuncFormatter

        plain = FuncFormatter(lambda value, _: f"{value:g}")  # 20, not 2×10¹
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(plain)
        ax.set_title(f"{ax.get_title()}, slowest {1 - tail:.0%}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return figure


def per_worker_chart(df: pd.DataFrame, roles: dict[str, str] | None = None) -> Chart:
    """Requests and median TTFT per serving worker (from ``nvext.worker_id``), per label.

    Labels that share workers (router modes over one fleet) get side-by-side bars per worker;
    labels with workers of their own (one fleet each) get one bar per worker, grouped by label.
    ``roles`` names workers by what they are (worker id → ``"fast"``, ``"prefill"``, …);
    without it a worker is shown by the last characters of its id.

    Example::

        bench.per_worker_chart(df, roles=df.groupby("worker")["speed"].first().to_dict())
    """
    served = df[df["worker"].notna()]
    labels = list(dict.fromkeys(served["label"].tolist()))
    owners = served.groupby("worker")["label"].nunique() if len(served) else pd.Series(dtype=int)
    own_fleets = len(labels) > 1 and bool((owners == 1).all())
    workers = (
        [w for label in labels for w in sorted(served.loc[served["label"] == label, "worker"].unique())]
        if own_fleets
        else sorted(served["worker"].unique().tolist())
    )
    figure, (count_ax, ttft_ax) = _chart(2, width=max(5.0, 0.45 * len(workers) + 1.5))
    if served.empty:
        _empty(count_ax, "no worker ids in these results:\nthe server did not report them")
        ttft_ax.set_axis_off()
        return figure
    positions = np.arange(len(workers))
    tick = {worker: position for position, worker in enumerate(workers)}
    width = 0.8 if own_fleets else 0.8 / len(labels)
    for i, (color, label) in enumerate(zip(_colors(), labels, strict=False)):
        group = served[served["label"] == label]
        served_here = set(group["worker"])
        mine = [w for w in workers if w in served_here] if own_fleets else workers
        counts = group.groupby("worker").size().reindex(mine, fill_value=0)
        ttft = group[group["error"].isna()].groupby("worker")["ttft_s"].median().reindex(mine) * 1000.0
        if own_fleets:  # one bar on each of its own workers' ticks
            offset = np.array([tick[w] for w in mine], dtype=float)
        else:  # side by side around each shared worker's tick
            offset = positions + (i - (len(labels) - 1) / 2) * width
        count_ax.bar(offset, counts.to_numpy(), width, color=color, label=label or None)
        ttft_ax.bar(offset, ttft.to_numpy(), width, color=color, label=label or None)
    if roles:
        names = [roles.get(w, w[-4:]) for w in workers]
    else:
        names = [w if len(w) <= 6 else "…" + w[-4:] for w in workers]  # ids often share a prefix
    for ax, title, unit in (
        (count_ax, "requests per worker (count)", "requests"),
        (ttft_ax, "median TTFT per worker (ms)", "ms"),
    ):
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.set_xticks(positions, names, fontsize="small")
        ax.set_xlabel("worker" if roles else "worker (last characters of its instance id)")
        ax.grid(True, axis="y", alpha=0.3)
    if len(labels) > 1:  # one legend above both panels, never over the bars
        handles, names = count_ax.get_legend_handles_labels()
        figure.legend(handles, names, loc="outside upper center", ncols=min(len(labels), 4), fontsize="small")
    _readable_ticks(figure)
    return figure


def path_chart(df: pd.DataFrame) -> Chart:
    """TTFT and end-to-end per serving path (aggregated, fast, fallback): a bar at the median
    with its 95 % interval (`median_interval`, thick), a thin whisker to p99."""
    figure, (ttft_ax, e2e_ax) = _chart(2)
    ok = df[df["error"].isna() & df["path"].notna()]
    if ok.empty:
        _empty(ttft_ax, "no path in these results:\nthe server did not report one")
        e2e_ax.set_axis_off()
        return figure
    order = [p for p in ("aggregated", "fast", "fallback", "disaggregated") if p in set(ok["path"])]
    order += sorted(set(ok["path"]) - set(order))
    for ax, column, title in ((ttft_ax, "ttft_s", "time to first token"), (e2e_ax, "e2e_s", "end-to-end")):
        values = [ok[ok["path"] == p][column] * 1000.0 for p in order]
        intervals = [median_interval(v) for v in values]
        p50 = [middle for _, middle, _ in intervals]
        p99 = [v.quantile(0.99) for v in values]
        colors = [c for c, _ in zip(_colors(), order, strict=False)]
        ax.bar(order, p50, color=colors, alpha=0.7)
        ax.errorbar(order, p50, yerr=[[0] * len(order), [b - a for a, b in zip(p50, p99, strict=True)]],
                    fmt="none", ecolor="grey", elinewidth=1, capsize=3)  # fmt: skip
        low = [0.0 if math.isnan(lo) else middle - lo for lo, middle, _ in intervals]  # NaN: too few values
        high = [0.0 if math.isnan(hi) else hi - middle for _, middle, hi in intervals]
        ax.errorbar(order, p50, yerr=[low, high], fmt="none", ecolor="black", elinewidth=4, capsize=0)
        for x, (count, value) in enumerate(zip([len(v) for v in values], p50, strict=True)):
            # at the bar's foot, clear of the interval drawn around its top
            ax.text(x, 0, f" {value:.1f} ms\n n={count}", ha="center", va="bottom", fontsize="small")
        ax.set_title(f"{title} by path (ms)\nbar: median, thick: its 95 % interval, thin: to p99")
        ax.set_ylabel("ms")
        ax.grid(True, axis="y", alpha=0.3)
    return figure


def spread_chart(
    df: pd.DataFrame, metric: str = "ttft", repeat: str = "repeat", *, by: str = "label", q: float = 0.5
) -> Chart:
    """Each group's ``metric`` (``ttft`` or ``e2e``, at quantile ``q``: the median unless told)
    over repeats of a comparison: a bar at the median of the repeats' figures, a whisker from the
    lowest to the highest, a dot per repeat (`spread` gives the numbers). Whiskers that do not
    overlap: a difference beyond the noise.

    Example::

        bench.spread_chart(df)  # df: several labels, each request tagged with its repeat
        bench.spread_chart(df, "e2e", q=0.9)  # each repeat's p90 end-to-end
    """
    table = spread(df, metric, repeat, by=by, q=q)
    figure, (ax,) = _chart(1, width=6.0)
    labels = [str(label) for label in table.index]
    colors = [c for c, _ in zip(_colors(), labels, strict=False)]
    middle, low, high = table["median_ms"], table["low_ms"], table["high_ms"]
    ax.bar(labels, middle, color=colors, alpha=0.6)
    ax.errorbar(labels, middle, yerr=[middle - low, high - middle], fmt="none", ecolor="black", capsize=6)
    repeats = [c for c in table.columns if c not in ("median_ms", "low_ms", "high_ms")]
    for x, label in enumerate(table.index):
        ax.plot([x] * len(repeats), table.loc[label, repeats], "o", color="black", markersize=3)
    statistic = "median" if q == 0.5 else f"p{q * 100:g}"
    ax.set_title(
        f"{statistic} {metric.upper()} per repeat (ms)\nbar: the median, whisker: the range, n={len(repeats)}"
    )
    ax.set_ylabel("ms")
    ax.set_ylim(0, float(high.max()) * 1.15)
    ax.grid(True, axis="y", alpha=0.3)
    return figure


def profile_chart(model: ProfiledTiming) -> Chart:
    """A profile's fit and its residuals: the measured first tokens over input length with the
    fitted curve; each decode measurement against what the model predicts for it (on a grid,
    from the other points: `ProfiledTiming.decode_checks`; the diagonal is a perfect
    prediction), one color per batch size; each point's error in percent.

    Example::

        bench.profile_chart(ProfiledTiming.fit(await bench.profile(url, "tiny-llama")))
    """
    figure, (prefill_ax, decode_ax, error_ax) = _chart(3, width=4.4)
    tokens = np.array([t for t, _ in model.profile.prefill], dtype=float)
    measured = np.array([ms for _, ms in model.profile.prefill], dtype=float)
    grid = np.linspace(float(tokens.min()), float(tokens.max()), 100)
    prefill_ax.plot(grid, [model.first_token_ms(round(t)) for t in grid], color="tab:blue", label="fit")
    prefill_ax.scatter(tokens, measured, color="black", s=14, zorder=3, label="measured")
    prefill_ax.set_title("prefill (ms)")
    prefill_ax.set_xlabel("input tokens")
    prefill_ax.legend(loc="upper left", fontsize="small")
    colors = _colors()
    checks = list(zip(model.profile.decode, model.decode_checks(), strict=True))
    for batch in sorted({b for b, _, _ in model.profile.decode}):
        points = [(predicted, ms) for (b, _, ms), predicted in checks if b == batch]
        decode_ax.scatter(
            [predicted for predicted, _ in points], [ms for _, ms in points], s=14, color=next(colors),
            label=f"batch {batch}",
        )  # fmt: skip
    low, high = decode_ax.get_xlim()
    decode_ax.plot([low, high], [low, high], color="grey", linestyle=":", linewidth=1)
    decode_ax.set_title("decode step: measured against predicted (ms)")
    decode_ax.set_xlabel("predicted from the other points (ms)")
    decode_ax.legend(loc="upper left", fontsize="small")
    errors = model.residuals()
    for position, kind in enumerate(("prefill", "decode")):
        values = errors[kind]
        error_ax.scatter([position] * len(values), values, s=14, color="black")
    error_ax.axhline(0, color="grey", linewidth=1)
    error_ax.set_xticks([0, 1], ["prefill", "decode"])
    error_ax.set_xlim(-0.6, 1.6)
    error_ax.set_title("each point's error (%)")
    _readable_ticks(figure)
    return figure


def _overlapping_ticks(ax: Any, renderer: Any) -> list[tuple[str, str]]:
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    return [
        (labels[i].get_text(), labels[i + 1].get_text())
        for i in range(len(boxes) - 1)
        if boxes[i].overlaps(boxes[i + 1])
    ]


def _readable_ticks(figure: Figure) -> None:
    """Turn the x tick labels of each panel that overlap: 30 degrees, then upright if need be."""
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's canvas, the charts' backend
    for angle in (30, 90):
        figure.canvas.draw()
        crowded = [ax for ax in figure.axes if ax.axison and _overlapping_ticks(ax, renderer)]
        if not crowded:
            return
        for ax in crowded:
            for text in ax.get_xticklabels():
                text.set(rotation=angle, ha="right" if angle < 90 else "center", rotation_mode="anchor")


def layout_problems(figure: Figure) -> list[str]:
    """What makes a chart hard to read, as sentences: x tick labels that overlap, a legend drawn
    over a panel's bars or lines, a figure legend over a panel, a title or tick label cut by the
    figure's edge. Empty when none.

    Example::

        assert bench.layout_problems(bench.per_worker_chart(df)) == []
    """
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's canvas, the charts' backend
    problems = []
    for index, ax in enumerate(figure.axes):
        if not ax.axison:
            continue
        name = ax.get_title() or f"panel {index}"
        problems += [f"{name}: x labels {a!r} and {b!r} overlap" for a, b in _overlapping_ticks(ax, renderer)]
        legend = ax.get_legend()
        if legend is not None:
            box = legend.get_window_extent(renderer)
            bars = [p for p in ax.patches if p.get_window_extent(renderer).overlaps(box)]
            lines = [
                line for line in ax.lines
                if line.get_transform().transform_path(line.get_path()).intersects_bbox(box, filled=False)
            ]  # fmt: skip
            if bars or lines:
                problems.append(f"{name}: the legend covers {len(bars)} bars and {len(lines)} lines")
    for legend in figure.legends:
        box = legend.get_window_extent(renderer)
        covered = [ax.get_title() for ax in figure.axes if ax.get_window_extent(renderer).overlaps(box)]
        if covered:
            problems.append(f"the figure legend covers the panels {covered}")
    return problems + _clipped_texts(figure, renderer)


def _drawn_labels(ticks: Any, labels: list[Any], limits: tuple[float, float]) -> list[Any]:
    """The tick labels drawn: those of ticks within the axis' limits (the others are not)."""
    low, high = min(limits), max(limits)
    return [label for tick, label in zip(ticks, labels, strict=False) if low <= tick <= high]


def _clipped_texts(figure: Figure, renderer: Any) -> list[str]:
    """Titles and tick labels that reach past the figure's edge (drawn cut off)."""
    edge = figure.bbox
    texts = [figure._suptitle] if figure._suptitle is not None else []  # type: ignore[attr-defined]  # matplotlib keeps the suptitle there
    for ax in figure.axes:
        if ax.axison:
            texts += [ax.title, *_drawn_labels(ax.get_xticks(), ax.get_xticklabels(), ax.get_xlim())]
            texts += _drawn_labels(ax.get_yticks(), ax.get_yticklabels(), ax.get_ylim())
    problems = []
    for text in texts:
        if not text.get_visible() or not text.get_text():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < edge.x0 - 1 or box.x1 > edge.x1 + 1 or box.y0 < edge.y0 - 1 or box.y1 > edge.y1 + 1:
            problems.append(f"{text.get_text()!r} is cut by the figure's edge")
    return problems


def _colors() -> Iterator[str]:
    while True:
        yield from ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


CHARTS = {
    "ttft_itl": ttft_itl_chart,
    "throughput": throughput_chart,
    "cdf": latency_cdf,
    "per_worker": per_worker_chart,
    "path": path_chart,
    "pareto": pareto_chart,
}
