"""A load sweep's progress bar: a widget in a notebook (with a readable plain-text form), tqdm on
a terminal.

Example::

    bar = progress_bar(total=64, desc="bench", enabled=True)
    bar.set_description("concurrency 8")
    bar.update(1)
    bar.close()
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..jupyter import in_notebook, widget_with_plain_text

__all__ = ["ProgressBar", "progress_bar"]


class ProgressBar(Protocol):
    """What `bench.run` calls on its bar."""

    def update(self, n: int = 1) -> object: ...

    def set_description(self, desc: str) -> object: ...

    def close(self) -> object: ...


class WidgetProgress:
    """An ipywidgets bar with a label, a count and the rate so far.

    Its plain-text form (shown before widgets render, and what nbval compares) says what it
    measures, not the 0 % of the moment it was displayed.
    """

    MIN_INTERVAL = 0.25
    """Seconds between redraws: each is two messages to the front end, and a kernel's output
    channel drops messages past its high-water mark (a sweep of thousands of requests would
    lose the kernel's own "idle" message; nbval then times out)."""

    def __init__(self, total: int, desc: str) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self._total = total
        self._done = 0
        self._start = self._drawn = time.perf_counter()
        self._label = widgets.Label(desc)
        self._bar = widgets.IntProgress(value=0, min=0, max=max(total, 1))
        self._count = widgets.Label(f"0/{total}")
        self._box = widget_with_plain_text(
            widgets.HBox,
            f"{desc}: {total} requests (a progress bar while the sweep runs)",
            [self._label, self._bar, self._count],
        )
        display(self._box)

    def update(self, n: int = 1) -> None:
        self._done += n
        now = time.perf_counter()
        if self._done < self._total and now - self._drawn < self.MIN_INTERVAL:
            return  # drawn at the next update after MIN_INTERVAL, at the last one, or at close
        self._draw(now)

    def _draw(self, now: float) -> None:
        self._drawn = now
        self._bar.value = min(self._done, self._total)
        elapsed = now - self._start
        rate = f" · {self._done / elapsed:.1f} req/s" if elapsed > 0 else ""
        self._count.value = f"{self._done}/{self._total}{rate}"

    def set_description(self, desc: str) -> None:
        self._label.value = desc

    def close(self) -> None:
        self._draw(time.perf_counter())
        self._bar.bar_style = "success" if self._done >= self._total else "warning"


class NoProgress:
    """A bar that shows nothing (``progress=False``)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool) -> ProgressBar:
    """A widget bar in a notebook (where ipywidgets is installed), tqdm's text bar elsewhere, or
    nothing when not ``enabled``."""
    if not enabled:
        return NoProgress()
    if in_notebook():
        try:
            return WidgetProgress(total, desc)
        except ImportError:
            pass
    from tqdm import tqdm

    bar: Any = tqdm(total=total, desc=desc, unit="req", leave=True)
    return bar
