"""Helpers for code that runs both as notebook cells and as an exported script.

A tutorial notebook tags its interactive cells (top-level ``await``, demos) with
`NOTEBOOK_ONLY_TAG`; ``jupyter nbconvert --to script`` drops them (`kept_cells`, which
`dynamo_nb.notebook.export` hands nbconvert)
and the last cell, an entry point, runs the script's ``main`` only outside a kernel::

    if __name__ == "__main__" and not in_notebook():
        raise SystemExit(asyncio.run(main()))
"""

from __future__ import annotations

import functools
import sys
from typing import Any

__all__ = ["NOTEBOOK_ONLY_TAG", "PngDisplay", "in_notebook", "kept_cells", "widget_with_plain_text"]

NOTEBOOK_ONLY_TAG = "notebook-only"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where ``__name__`` is also ``"__main__"``).

    Example:
        >>> in_notebook()
        False
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class PngDisplay:
    """One image in a notebook's output, replaced in place on each `show` (nothing outside a kernel).

    Example:
        >>> view = PngDisplay()
        >>> view.show(b"\\x89PNG...")   # the first call displays, later ones update it
        >>> view.shown
        False
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self.shown = False

    def show(self, png: bytes) -> None:
        """Display ``png`` (a notebook only), replacing what this display showed before."""
        if not in_notebook():
            return
        from IPython.display import Image, display

        if self._handle is None:
            self._handle = display(Image(data=png, format="png"), display_id=True)
        else:
            self._handle.update(Image(data=png, format="png"))
        self.shown = True


def widget_with_plain_text(widget_class: type, plain_text: str, *args: Any, **kwargs: Any) -> Any:
    """An instance of the ipywidgets class ``widget_class`` (built with ``args`` and ``kwargs``)
    whose plain-text form is ``plain_text``: what a notebook shows before its widgets render
    (a fresh, untrusted open) and what nbval compares, instead of the widget's field dump.

    Example::

        box = widget_with_plain_text(widgets.HBox, "bench: 64 requests", [label, bar])
        display(box)
    """
    widget = _plain_text_subclass(widget_class)(*args, **kwargs)
    widget.plain_text = plain_text
    return widget


@functools.cache
def _plain_text_subclass(widget_class: type) -> type:
    """One subclass per widget class, made on first use (ipywidgets is imported by the caller)."""

    class PlainText(widget_class):
        plain_text = ""

        def __repr__(self) -> str:
            return self.plain_text or super().__repr__()

    PlainText.__name__ = PlainText.__qualname__ = f"{widget_class.__name__}WithPlainText"
    return PlainText


def _interactive(cell: Any) -> bool:
    return NOTEBOOK_ONLY_TAG in cell.get("metadata", {}).get("tags", [])


def kept_cells(cells: list[Any]) -> list[Any]:
    """The cells a script export keeps (those of notebook-only cells, and the prose that only introduces such cells, go: `dynamo_nb.notebook.export.RemoveNotebookOnlyCells`).

    Example:
        >>> md, code = {"cell_type": "markdown"}, {"cell_type": "code"}
        >>> demo = {"cell_type": "code", "metadata": {"tags": ["notebook-only"]}}
        >>> cells = [md, code, {**md, "id": "demo prose"}, demo, {**md, "id": "end"}, code]
        >>> [c.get("id", c["cell_type"]) for c in kept_cells(cells)]
        ['markdown', 'code', 'end', 'code']
    """
    kept = []
    for index, cell in enumerate(cells):
        if _interactive(cell):
            continue
        if cell.get("cell_type") == "markdown" and index > 0:
            following = []
            for later in cells[index + 1 :]:
                if later.get("cell_type") == "markdown":
                    break
                following.append(later)
            if not any(c.get("cell_type") == "code" and not _interactive(c) for c in following):
                continue  # it only introduces notebook-only cells
        kept.append(cell)
    return kept
