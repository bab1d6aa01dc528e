"""`IntervalLoop`: a decision every ``interval`` seconds in the background, each a row, with a
live chart in a notebook; what the `Autoscaler` and the `Retuner` share.

A subclass writes `step` (one decision now: its row, appended to ``records``) and `chart`;
``async with`` (or `start` / `stop`) runs it. A decision begun when `stop` is called finishes
first (its change is not cut in half), and the live chart's last frame shows every decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ..jupyter import PngDisplay

if TYPE_CHECKING:
    from ..bench.charts import Chart

__all__ = ["IntervalLoop"]

logger = logging.getLogger("dynamo_nb.planner")


class IntervalLoop:
    """See the module docstring.

    Attributes:
        interval: seconds between two decisions.
        records: the decision rows so far.
        drawn_decisions: how many decisions the live chart's last frame shows.
    """

    name = "planner loop"

    def __init__(self, interval: float, *, live: bool = False) -> None:
        self.interval = interval
        self.records: list[dict[str, Any]] = []
        self.drawn_decisions = 0
        self._task: asyncio.Task[None] | None = None
        self._step: asyncio.Future[dict[str, Any]] | None = None  # the decision being made now
        self._display = PngDisplay() if live else None
        self._decided = asyncio.Event()

    async def step(self) -> dict[str, Any]:
        """One decision now: its row (appended to ``records``)."""
        raise NotImplementedError

    def chart(self) -> Chart:
        """The decisions so far, drawn."""
        raise NotImplementedError

    async def _prepare(self) -> None:
        """What `start` does before the first interval (a baseline reading)."""

    async def start(self) -> None:
        """`_prepare`, then decide every ``interval`` in the background."""
        if self._task is not None:
            return
        await self._prepare()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"dynamo_nb.{self.name}")

    async def stop(self) -> None:
        """Stop deciding: a decision begun finishes first, and the live chart's last frame shows
        every decision."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._step is not None:  # the loop was stopped while it waited for this decision
            try:
                await self._step
            except Exception:  # the loop did not log it
                logger.warning("%s step failed", self.name, exc_info=True)
            self._step = None
        await self._redraw()

    @property
    def is_running(self) -> bool:
        """Whether it decides in the background now."""
        return self._task is not None

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            # shielded: a stop meanwhile lets the decision (a change begun) finish; `stop` awaits it
            self._step = asyncio.ensure_future(self.step())
            try:
                await asyncio.shield(self._step)
            except asyncio.CancelledError:
                raise
            except Exception:  # a missed reading or a failed change: logged, the next interval tries again
                logger.warning("%s step failed", self.name, exc_info=True)
            self._step = None

    async def _recorded(self, row: dict[str, Any]) -> dict[str, Any]:
        """Append a decision's row, redraw, and wake those waiting for a decision."""
        self.records.append(row)
        await self._redraw()
        self._decided.set()  # after the chart shows it: a caller that stops on this decision sees it drawn
        return row

    async def _redraw(self) -> None:
        """Show the chart of every decision so far (a notebook with ``live=True``), unless the
        last frame already does."""
        rows = len(self.records)
        if self._display is not None and rows > 1 and rows != self.drawn_decisions:
            self._display.show(await asyncio.to_thread(lambda: self.chart().to_png()))
            self.drawn_decisions = rows
