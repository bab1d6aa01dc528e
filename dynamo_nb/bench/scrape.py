"""A server's Prometheus metrics as a DataFrame, and runs joined with the routing decisions.

Example::

    metrics = await bench.scrape_metrics("http://127.0.0.1:8000")
    metrics[metrics.name == "dynamo_frontend_time_to_first_token_seconds_bucket"]
    bench.histogram(metrics, "dynamo_frontend_time_to_first_token_seconds")   # le, count, share
    df = bench.with_routing(df, frontend.routing_records)   # each request's router, margin, parts
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..http.lean_client import ServerAnswerError, fetch

if TYPE_CHECKING:
    import pandas as pd

    from ..router.decision import RoutingRecords

__all__ = ["histogram", "histogram_quantile", "parse_metrics", "scrape_metrics", "with_routing"]


def parse_metrics(text: str) -> pd.DataFrame:
    """One row per sample of Prometheus ``text``: ``name``, ``value``, ``type`` (of its family)
    and a column per label.

    Example:
        >>> row = parse_metrics('# TYPE up gauge\\nup{job="a"} 1\\n').iloc[0]
        >>> row["name"], float(row["value"]), row["type"], row["job"]
        ('up', 1.0, 'gauge', 'a')
    """
    import pandas as pd
    from prometheus_client.parser import text_string_to_metric_families

    rows = [
        {"name": sample.name, "value": sample.value, "type": family.type, **sample.labels}
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    return pd.DataFrame(rows, columns=None if rows else ["name", "value", "type"])


async def scrape_metrics(url: str, timeout: float = 10.0) -> pd.DataFrame:
    """`parse_metrics` of ``url``'s ``/metrics`` (``url`` is the server's base URL)."""
    metrics_url = url.rstrip("/") + "/metrics"
    status, body = await fetch(metrics_url, timeout=timeout)
    if status != 200:
        raise ServerAnswerError(f"{metrics_url} answered {status}: {body[:200].decode(errors='replace')}")
    return parse_metrics(body.decode())


def histogram(metrics: pd.DataFrame, name: str, **labels: str) -> pd.DataFrame:
    """The buckets of histogram ``name`` (for the samples with ``labels``): ``le``, the
    cumulative ``count``, and ``share`` (the fraction of observations at or under ``le``)."""
    rows = metrics[metrics["name"] == f"{name}_bucket"]
    for key, value in labels.items():
        rows = rows[rows[key] == value]
    table = rows[["le", "value"]].rename(columns={"value": "count"}).copy()
    table["le"] = table["le"].astype(float)
    table = table.groupby("le", as_index=False)["count"].sum().sort_values("le")
    total = table["count"].max() if len(table) else 0
    table["share"] = table["count"] / total if total else 0.0
    return table.reset_index(drop=True)


def histogram_quantile(before: pd.DataFrame | None, after: pd.DataFrame, name: str, q: float) -> float:
    """The ``q`` quantile (0..1) of what histogram ``name`` observed between two scrapes
    (``before`` None: since the start), interpolated within its bucket as Prometheus's
    ``histogram_quantile`` does; NaN when it observed nothing.

    Example:
        >>> one = parse_metrics('# TYPE t histogram\\nt_bucket{le="0.1"} 1\\nt_bucket{le="0.2"} 1\\nt_bucket{le="+Inf"} 1\\n')
        >>> two = parse_metrics('# TYPE t histogram\\nt_bucket{le="0.1"} 1\\nt_bucket{le="0.2"} 5\\nt_bucket{le="+Inf"} 5\\n')
        >>> round(histogram_quantile(one, two, "t", 0.5), 3)   # 4 new observations, all in (0.1, 0.2]
        0.15
    """

    def observed(metrics: pd.DataFrame | None) -> bool:
        return metrics is not None and len(metrics) > 0 and bool((metrics["name"] == f"{name}_bucket").any())

    if not observed(after):
        return float("nan")
    counts = histogram(after, name).set_index("le")["count"]
    if observed(before):
        counts = counts.sub(histogram(before, name).set_index("le")["count"], fill_value=0)
    if not len(counts) or counts.iloc[-1] <= 0:
        return float("nan")
    rank = q * counts.iloc[-1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in counts.items():
        if count >= rank:
            if bound == float("inf"):
                return float(lower_bound)
            width = count - lower_count
            return float(
                lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 0.0)
            )
        lower_bound, lower_count = float(bound), float(count)
    return float(lower_bound)


def with_routing(records: pd.DataFrame, routing: RoutingRecords, hop: str = "decode") -> pd.DataFrame:
    """``records`` (from `dynamo_nb.bench.run`) with the decode (or prefill) router's decision
    of each request: ``router``, ``margin``, ``tie``, ``rule`` and the chosen candidate's
    ``score`` and score parts, joined on ``request_id``."""
    import pandas as pd

    chosen: list[dict[str, Any]] = [row for row in routing.rows() if row["chosen"] and row["hop"] == hop]
    decisions = pd.DataFrame(chosen).drop(columns=["chosen", "hop", "model", "instance"], errors="ignore")
    if decisions.empty:
        return records.copy()
    decisions = decisions.drop_duplicates("request_id", keep="last")
    return records.merge(decisions, on="request_id", how="left")
