"""Where a launched program's output lines go besides its log file: a notebook widget or stdout."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from ..jupyter import widget_with_plain_text

__all__ = ["LogSink", "StdoutLog", "WidgetLog", "log_sink"]


class LogSink(Protocol):
    """Receives each output line of a launched program, and its status changes."""

    def line(self, text: str) -> None: ...

    def status(self, text: str) -> None: ...


class StdoutLog:
    """Prints each line with a ``[name]`` prefix (scripts)."""

    def __init__(self, name: str) -> None:
        self.prefix = f"[{name}] "

    def line(self, text: str) -> None:
        print(self.prefix + text, flush=True)

    def status(self, text: str) -> None:
        print(self.prefix + "-- " + text, flush=True)


class WidgetLog:
    """An ipywidgets Accordion (title = status) holding an Output with the last lines.

    Redraws at most every ``interval`` seconds, so a chatty program costs little; the whole
    log stays in the file whose path is the first line shown.
    """

    def __init__(self, title: str, log_path: str, max_lines: int = 40, interval: float = 0.25) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self._title = title
        self._header = f"log: {log_path}"
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._interval = interval
        self._pending = False
        self._output = widgets.Output(layout=widgets.Layout(border="1px solid #ddd"))
        self._box = widget_with_plain_text(
            widgets.Accordion,
            f"[{title}] live output in a widget while the notebook runs; whole log in a file",
            children=[self._output],
            titles=(title,),
            selected_index=0,
        )
        self._draw()
        display(self._box)

    def line(self, text: str) -> None:
        self._lines.append(text)
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_later(self._interval, self._draw)

    def status(self, text: str) -> None:
        self._box.set_title(0, f"{self._title} · {text}")
        self._draw()

    def _draw(self) -> None:
        self._pending = False
        text = "\n".join([self._header, *self._lines]) + "\n"
        self._output.outputs = ({"output_type": "stream", "name": "stdout", "text": text},)


def log_sink(show: bool, in_notebook: bool, name: str, title: str, log_path: str) -> LogSink | None:
    """The sink for ``show_logs``: a widget in a notebook (when ipywidgets is there), else stdout."""
    if not show:
        return None
    if in_notebook:
        try:
            return WidgetLog(title, log_path)
        except ImportError:
            pass
    return StdoutLog(name)
