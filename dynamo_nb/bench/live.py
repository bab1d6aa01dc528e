"""`live`: one chart redrawn in place while `bench.run` is going.

In a notebook the chart is one display (a display handle) whose image is replaced on each
redraw, so a sweep leaves one figure, not one per update. Rendering runs in a worker thread
to keep the event loop (and the measurement) moving. Outside a notebook nothing is shown;
give ``path=`` to keep the last drawing as a PNG.

Example::

    view = bench.live(bench.ttft_itl_chart, every=1.0)
    df = await bench.run(url, "tiny-llama", concurrency=[1, 4, 8], live=view)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import ConfigError
from ..jupyter import PngDisplay
from .charts import CHARTS, Chart
from .records import records_frame

__all__ = ["LiveChart", "live"]


class LiveChart:
    """Redraws ``chart(df)`` every ``every`` seconds from the records of a running `bench.run`.

    Attributes:
        redraws: how many times it has drawn.
        last_png: the latest drawing (PNG bytes), or None before the first.
    """

    def __init__(self, chart: Callable[[pd.DataFrame], Chart], every: float, path: str | Path | None) -> None:
        """Use `live`."""
        self.chart = chart
        self.every = every
        self.path = Path(path) if path is not None else None
        self.redraws = 0
        self.last_png: bytes | None = None
        self._records: list[dict[str, Any]] = []
        self._drawn = 0
        self._task: asyncio.Task[None] | None = None
        self._display = PngDisplay()

    def start(self, records: list[dict[str, Any]]) -> None:
        """Follow ``records`` (the list `bench.run` appends to) until `stop`."""
        self._records = records
        self._drawn = 0
        self._task = asyncio.get_running_loop().create_task(self._redraw_loop(), name="dynamo_nb.bench.live")

    async def stop(self) -> None:
        """Stop following and draw the final state (saved to ``path`` when given)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._draw()
        if self.path is not None and self.last_png is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(self.last_png)

    async def _redraw_loop(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            await self._draw()

    async def _draw(self) -> None:
        count = len(self._records)
        if count == 0 or count == self._drawn:
            return
        snapshot = self._records[:count]
        self.last_png = await asyncio.to_thread(self._render, snapshot)
        self._drawn = count
        self.redraws += 1
        self._display.show(self.last_png)

    def _render(self, snapshot: list[dict[str, Any]]) -> bytes:
        return self.chart(records_frame(snapshot)).to_png()


def live(
    chart: str | Callable[[pd.DataFrame], Chart] = "ttft_itl",
    *,
    every: float = 1.0,
    path: str | Path | None = None,
) -> LiveChart:
    """A `LiveChart` for ``bench.run(..., live=...)``.

    Args:
        chart: a chart function of `dynamo_nb.bench` (or any ``df → Figure`` with ``to_png``),
            or its short name: ``ttft_itl``, ``throughput``, ``cdf``, ``per_worker``.
        every: seconds between redraws (each costs some CPU: keep it ≥ 0.5).
        path: where to save the final drawing as PNG.
    """
    if isinstance(chart, str):
        try:
            chart = CHARTS[chart]
        except KeyError:
            raise ConfigError(f"unknown chart {chart!r}: use one of {', '.join(CHARTS)}") from None
    if not every > 0:
        raise ConfigError(f"every must be a positive number of seconds, got {every!r}")
    return LiveChart(chart, every, path)
