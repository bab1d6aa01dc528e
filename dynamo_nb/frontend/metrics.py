"""The frontend's Prometheus metrics, in the text exposition format (no dependency).

Names follow Dynamo's frontend (``dynamo_frontend_*``), so existing dashboards read them.

Example:
    >>> metrics = FrontendMetrics()
    >>> metrics.requests.inc(model="tiny", endpoint="chat_completions", request_type="stream", status="success")
    >>> 'dynamo_frontend_requests_total{model="tiny"' in metrics.render()
    True
"""

from __future__ import annotations

import bisect
from typing import Any

__all__ = ["Counter", "FrontendMetrics", "Gauge", "Histogram"]


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    pairs = [f'{n}="{v}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_text
        self.label_names = labels

    def _key(self, labels: dict[str, Any]) -> tuple[str, ...]:
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...]) -> None:
        super().__init__(name, help_text, labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: Any) -> None:
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        return self.header() + [
            f"{self.name}{_labels(self.label_names, k)} {v:g}" for k, v in sorted(self.values.items())
        ]


class Gauge(Counter):
    """A value that goes up and down per label set."""

    kind = "gauge"

    def dec(self, amount: float = 1.0, **labels: Any) -> None:
        self.inc(-amount, **labels)


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, labels: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self.series: dict[tuple[str, ...], list[float]] = {}  # bucket counts..., sum, count

    def observe(self, value: float, **labels: Any) -> None:
        key = self._key(labels)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [0.0] * (len(self.buckets) + 2)
        slot = bisect.bisect_left(self.buckets, value)
        if slot < len(self.buckets):  # above the last bound: only +Inf (the count) holds it
            series[slot] += 1
        series[-2] += value
        series[-1] += 1

    def render(self) -> list[str]:
        lines = self.header()
        for key, series in sorted(self.series.items()):
            running = 0.0
            for bound, count in zip(self.buckets, series, strict=False):
                running += count
                le = f'le="{bound:g}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {running:g}")
            inf = 'le="+Inf"'
            lines.append(f"{self.name}_bucket{_labels(self.label_names, key, inf)} {series[-1]:g}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, key)} {series[-2]:.6g}")
            lines.append(f"{self.name}_count{_labels(self.label_names, key)} {series[-1]:g}")
        return lines


_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)


class FrontendMetrics:
    """Requests, in-flight, TTFT, inter-token latency, duration and token counts per model."""

    def __init__(self) -> None:
        self.requests = Counter(
            "dynamo_frontend_requests_total",
            "HTTP requests by model, endpoint, stream or unary, and outcome",
            ("model", "endpoint", "request_type", "status"),
        )
        self.inflight = Gauge("dynamo_frontend_inflight_requests", "requests running now", ("model",))
        self.ttft = Histogram(
            "dynamo_frontend_time_to_first_token_seconds",
            "time to the first token",
            ("model",),
            _LATENCY_BUCKETS,
        )
        self.itl = Histogram(
            "dynamo_frontend_inter_token_latency_seconds", "time between tokens", ("model",), _LATENCY_BUCKETS
        )
        self.duration = Histogram(
            "dynamo_frontend_request_duration_seconds",
            "time of a whole request",
            ("model",),
            _LATENCY_BUCKETS,
        )
        self.input_tokens = Histogram(
            "dynamo_frontend_input_sequence_tokens", "prompt tokens per request", ("model",), _TOKEN_BUCKETS
        )
        self.disagg_requests = Counter(
            "dynamo_frontend_disagg_requests_total",
            "requests of models with prefill workers, by the path they took (fast, fallback, aggregated)",
            ("model", "path"),
        )
        self.prefill_errors = Counter(
            "dynamo_frontend_prefill_errors_total", "prefills that failed or whose handoff failed", ("model",)
        )
        self.output_tokens = Histogram(
            "dynamo_frontend_output_sequence_tokens",
            "generated tokens per request",
            ("model",),
            _TOKEN_BUCKETS,
        )

    def render(self) -> str:
        lines: list[str] = []
        for metric in (
            self.requests,
            self.inflight,
            self.ttft,
            self.itl,
            self.duration,
            self.input_tokens,
            self.output_tokens,
            self.disagg_requests,
            self.prefill_errors,
        ):
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"
