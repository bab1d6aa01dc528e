"""Helpers for code that runs both as notebook cells and as an exported script.

A tutorial notebook tags its interactive cells (top-level ``await``, demos) with
`NOTEBOOK_ONLY_TAG`; ``jupyter nbconvert --to script`` drops them (see `dynamo_nb.nbexport`)
and the last cell, an entry point, runs the script's ``main`` only outside a kernel::

    if __name__ == "__main__" and not in_notebook():
        raise SystemExit(asyncio.run(main()))
"""

from __future__ import annotations

import sys

__all__ = ["NOTEBOOK_ONLY_TAG", "in_notebook"]

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
