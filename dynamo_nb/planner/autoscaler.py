"""`Autoscaler`: follow a frontend's load and scale a running graph's workers to it.

Every ``interval`` seconds it reads the frontend's ``/metrics`` and works out how many
replicas of ``service`` the load needs:

- ``mode="load"``: requests in flight (running and queued) over ``target`` requests per worker;
- ``mode="throughput"``: requests per second answered over the interval, over ``target``
  requests per second per worker (e.g. the rate one worker served within the SLO in a `plan`);
- ``mode="slo"``: one more while the interval's p90 TTFT or ITL (from the frontend's
  histograms) is over ``slo``'s limit, one fewer while both are under ``headroom`` × the
  limits (or nothing ran), else as many as now.

Hysteresis and bounds: it scales up after ``up_after`` intervals in a row that wanted more
(straight to what they wanted, at most ``max_replicas``), down after ``down_after`` intervals in
a row that wanted fewer (one replica at a time, at least ``min_replicas``), and holds for
``cooldown`` seconds after each change. Scaling calls ``running.scale(service, n)``
(`dynamo_nb.graph.RunningGraph.scale`): new workers are ready when it returns, and discovery
lets the frontend follow.

Every interval is a row of `decisions` (a DataFrame); with ``live=True`` a notebook shows the
replicas against the load, redrawn each interval.

Example::

    scaler = Autoscaler(running, "mocker", running.url, mode="load", target=4, min_replicas=1, max_replicas=3)
    await scaler.start()
    ...                                   # traffic comes and goes
    await scaler.stop()
    scaler.decisions                      # t_s, inflight, req_per_s, ttft_p90_ms, replicas, desired, action, reason
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..bench.scrape import histogram_quantile, scrape_metrics
from ..bench.slo import SLO
from ..errors import ConfigError
from .interval_loop import IntervalLoop

if TYPE_CHECKING:
    import pandas as pd

    from ..bench.charts import Chart

__all__ = ["AUTOSCALE_MODES", "Autoscaler", "Scalable"]

logger = logging.getLogger("dynamo_nb.planner")

AUTOSCALE_MODES = ("load", "throughput", "slo")
_TTFT = "dynamo_frontend_time_to_first_token_seconds"
_ITL = "dynamo_frontend_inter_token_latency_seconds"


class Scalable(Protocol):
    """What the autoscaler scales: a `dynamo_nb.graph.RunningGraph`."""

    async def scale(self, service: str, replicas: int) -> None: ...


class Autoscaler(IntervalLoop):
    """See the module docstring.

    Attributes:
        replicas: the replicas of ``service`` now (as the autoscaler last set or found them).
        records: the decision rows so far (`decisions` is their DataFrame).
    """

    def __init__(
        self,
        running: Scalable,
        service: str,
        url: str,
        *,
        mode: str = "load",
        target: float | None = None,
        slo: SLO | None = None,
        headroom: float = 0.5,
        replicas: int | None = None,
        min_replicas: int = 1,
        max_replicas: int = 4,
        interval: float = 2.0,
        up_after: int = 1,
        down_after: int = 3,
        cooldown: float = 0.0,
        live: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in AUTOSCALE_MODES:
            raise ConfigError(f"unknown autoscaler mode {mode!r}: use one of {', '.join(AUTOSCALE_MODES)}")
        if mode in ("load", "throughput") and not (isinstance(target, (int, float)) and target > 0):
            raise ConfigError(f"mode {mode!r} needs target, a positive number per worker, got {target!r}")
        if mode == "slo" and (slo is None or (slo.ttft_ms is None and slo.itl_ms is None)):
            raise ConfigError("mode 'slo' needs slo=bench.SLO(ttft_ms=..., itl_ms=...)")
        if not 1 <= min_replicas <= max_replicas:
            raise ConfigError(
                f"bounds must satisfy 1 <= min_replicas <= max_replicas, got {min_replicas} and {max_replicas}"
            )
        if interval <= 0 or up_after < 1 or down_after < 1 or cooldown < 0 or not 0 < headroom < 1:
            raise ConfigError(
                "interval must be positive, up_after and down_after at least 1, cooldown 0 or more, "
                "headroom between 0 and 1"
            )
        self.running = running
        self.service = service
        self.url = url.rstrip("/")
        self.mode = mode
        self.target = target
        self.slo = slo
        self.headroom = headroom
        self.replicas = (
            replicas if replicas is not None else self._replicas_of(running, service, min_replicas)
        )
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        super().__init__(interval, live=live)
        self.up_after = up_after
        self.down_after = down_after
        self.cooldown = cooldown
        self._streak = 0  # intervals in a row that wanted more (> 0) or fewer (< 0)
        self._changed_at = -math.inf
        self._previous: pd.DataFrame | None = None
        self._previous_at = 0.0
        self._origin = 0.0
        self._clock = clock

    @staticmethod
    def _replicas_of(running: Any, service: str, default: int) -> int:
        graph = getattr(running, "graph", None)
        spec = getattr(graph, "services", {}).get(service) if graph is not None else None
        return int(getattr(spec, "replicas", default)) if spec is not None else default

    @property
    def decisions(self) -> pd.DataFrame:
        """One row per interval: ``t_s`` (since `start`), ``inflight``, ``req_per_s``,
        ``ttft_p90_ms``, ``itl_p90_ms``, ``replicas`` (after the decision), ``desired``,
        ``action`` (up, down, hold) and ``reason``."""
        import pandas as pd

        columns = ["t_s", "inflight", "req_per_s", "ttft_p90_ms", "itl_p90_ms", "replicas", "desired",
                   "action", "reason"]  # fmt: skip
        return pd.DataFrame(self.records, columns=columns)

    name = "autoscaler"

    async def _prepare(self) -> None:
        """Read the metrics once: the baseline of the first interval."""
        self._origin = self._clock()
        self._previous = await self._scrape()
        self._previous_at = self._clock()

    async def wait_for(self, replicas: int, timeout: float) -> bool:
        """Wait until a decision leaves ``replicas`` (at most ``timeout`` seconds); whether it did.

        Example::

            await scaler.wait_for(1, timeout=30)   # back to one worker once the load is gone
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.replicas != replicas:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._decided.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._decided.wait(), remaining)
        return True

    async def _scrape(self) -> pd.DataFrame:
        return await scrape_metrics(self.url, timeout=max(self.interval, 2.0))

    async def step(self) -> dict[str, Any]:
        """One decision now (the background task calls it every ``interval``): its row."""
        metrics = await self._scrape()
        now = self._clock()
        previous, elapsed = self._previous, now - self._previous_at
        self._previous, self._previous_at = metrics, now
        observed = _observe(previous, metrics, elapsed)
        desired, reason = self._desired(observed)
        action = self._decide(desired, now)
        if action != "hold":
            if action == "up":
                target = min(desired, self.max_replicas)
            else:
                target = max(self.replicas - 1, desired, self.min_replicas)
            await self.running.scale(self.service, target)
            reason += f"; scaled {self.replicas} → {target}"
            self.replicas = target
            self._changed_at = now
            self._streak = 0
        row = {"t_s": round(now - self._origin, 2), **observed, "replicas": self.replicas, "desired": desired,
               "action": action, "reason": reason}  # fmt: skip
        return await self._recorded(row)

    def _desired(self, observed: dict[str, float]) -> tuple[int, str]:
        """The replicas the interval's load asks for (within the bounds), and why."""
        current = self.replicas
        if self.mode == "load":
            want = math.ceil(observed["inflight"] / self.target) if observed["inflight"] else 0  # type: ignore[operator]  # target is set in every mode but 'plan'
            reason = f"{observed['inflight']:g} in flight / {self.target:g} per worker"
        elif self.mode == "throughput":
            want = math.ceil(observed["req_per_s"] / self.target)  # type: ignore[operator]  # target is set in every mode but 'plan'
            reason = f"{observed['req_per_s']:.2f} req/s / {self.target:.2f} per worker"
        else:
            assert self.slo is not None
            over, under = [], True
            for name, limit in (("ttft_p90_ms", self.slo.ttft_ms), ("itl_p90_ms", self.slo.itl_ms)):
                value = observed[name]
                if limit is None:
                    continue
                if not math.isnan(value) and value > limit:
                    over.append(f"{name} {value:.1f} > {limit:g}")
                if not math.isnan(value) and value > self.headroom * limit:
                    under = False
            if over:
                want, reason = current + 1, ", ".join(over)
            elif under:
                want, reason = current - 1, f"p90s under {self.headroom:g} × the SLO (or no traffic)"
            else:
                want, reason = current, "within the SLO"
        return max(self.min_replicas, min(self.max_replicas, want)), reason

    def _decide(self, desired: int, now: float) -> str:
        """``up``, ``down`` or ``hold``, with the hysteresis and cooldown."""
        if desired > self.replicas:
            self._streak = self._streak + 1 if self._streak > 0 else 1
        elif desired < self.replicas:
            self._streak = self._streak - 1 if self._streak < 0 else -1
        else:
            self._streak = 0
        if now - self._changed_at < self.cooldown:
            return "hold"
        if self._streak >= self.up_after:
            return "up"
        if -self._streak >= self.down_after:
            return "down"
        return "hold"

    def chart(self) -> Chart:
        """Replicas (and what the load asked for) over time, beside the load the mode follows."""
        from matplotlib.ticker import MaxNLocator

        from ..bench.charts import _chart

        table = self.decisions
        figure, (replica_ax, load_ax) = _chart(2)
        replica_ax.step(table["t_s"], table["replicas"], where="post", label="replicas", linewidth=2)
        replica_ax.plot(
            table["t_s"], table["desired"], linestyle=":", marker=".", label="asked for by the load"
        )
        replica_ax.axhspan(self.min_replicas - 0.05, self.max_replicas + 0.05, color="grey", alpha=0.08)
        replica_ax.set_title(f"{self.service} replicas ({self.mode} mode)")
        replica_ax.set_xlabel("seconds")
        replica_ax.set_ylabel("replicas")
        replica_ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: whole ticks
        replica_ax.legend(fontsize="small")
        column = {"load": "inflight", "throughput": "req_per_s", "slo": "ttft_p90_ms"}[self.mode]
        load_ax.plot(table["t_s"], table[column], marker=".", color="tab:orange")
        load_ax.set_title(column.replace("_", " "))
        load_ax.set_xlabel("seconds")
        for ax in (replica_ax, load_ax):
            ax.grid(True, alpha=0.3)
        return figure

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return (
            f"<Autoscaler {self.service} {self.mode} mode, {self.replicas} replicas "
            f"[{self.min_replicas}..{self.max_replicas}], {len(self.records)} decisions, {state}>"
        )


def _total(metrics: pd.DataFrame | None, name: str) -> float:
    if metrics is None or not len(metrics):
        return 0.0
    return float(metrics.loc[metrics["name"] == name, "value"].sum())


def _observe(previous: pd.DataFrame | None, metrics: pd.DataFrame, elapsed: float) -> dict[str, float]:
    """The interval's load: in flight (and queued) now, requests answered per second, p90 TTFT and ITL."""
    answered = _total(metrics, "dynamo_frontend_requests_total") - _total(
        previous, "dynamo_frontend_requests_total"
    )
    return {
        "inflight": _total(metrics, "dynamo_frontend_inflight_requests"),  # waiting to be let in too
        "req_per_s": answered / elapsed if elapsed > 0 else 0.0,
        "ttft_p90_ms": histogram_quantile(previous, metrics, _TTFT, 0.9) * 1000,
        "itl_p90_ms": histogram_quantile(previous, metrics, _ITL, 0.9) * 1000,
    }
