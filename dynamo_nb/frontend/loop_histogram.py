"""A Prometheus histogram for values observed on the hot path, from the event loop only.

`prometheus_client.Histogram.observe` takes a lock per bucket and per sum (~2 µs); the
frontend observes every inter-token gap, so that was a few per cent of its CPU (the cached
tokens and the router's overhead, once a request or a decision, use it too). A
`LoopHistogram` child keeps plain counts (one bisect and two additions per value, no lock: the
event loop is its only writer) and the registry reads them as a standard histogram family.

Example:
    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> registry = CollectorRegistry()
    >>> gaps = LoopHistogram("gap_seconds", "time between tokens", ("model",), (0.01, 0.1), registry)
    >>> gaps.labels("tiny").observe(0.02)
    >>> 'gap_seconds_bucket{le="0.1",model="tiny"} 1.0' in generate_latest(registry).decode()
    True
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["LoopHistogram"]


class _Child:
    """One label set's counts: ``counts[i]`` values ≤ ``bounds[i]`` (the last: +Inf), and their sum."""

    __slots__ = ("bounds", "counts", "sum", "zero_bucket")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.zero_bucket = bisect_left(bounds, 0.0)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_zeros(self, times: int) -> None:
        """``observe(0.0)`` ``times`` times, at the cost of one (a burst's tokens, gap 0).

        Example:
            >>> child = _Child((0.001, 0.01))
            >>> child.observe_zeros(3)
            >>> child.counts, child.sum
            ([3, 0, 0], 0.0)
        """
        self.counts[self.zero_bucket] += times


class LoopHistogram(Collector):
    """A labelled histogram written from one thread (see the module docstring)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self._children: dict[tuple[str, ...], _Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Child:
        """The child of one label set (made on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = _Child(self.bounds)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative, running = [], 0
            for bound, count in zip((*map(floatToGoString, self.bounds), "+Inf"), child.counts, strict=True):
                running += count
                cumulative.append((bound, running))
            family.add_metric(list(values), cumulative, child.sum)
        yield family
