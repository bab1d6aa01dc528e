"""The notebook layer: what makes a notebook's cells also a program.

- `display` (``display.py``): `in_notebook`, the `NOTEBOOK_ONLY_TAG`, `PngDisplay` and
  `widget_with_plain_text`, the small helpers the runtime, launch and bench layers use in a kernel.
- `export` (``export.py``): the nbconvert preprocessors that drop notebook-only cells when a
  notebook becomes a script (installed into the environment's ``etc/jupyter``).
- `declarations` (``declarations.py``): which component a file declares, one rule for graphs,
  ``--router-policy``, launch and the export check.
- `component_program` (``component_program.py``): `EngineProgram`, `HandlerProgram`,
  `RoutingPolicy`, a component declared in cells, and `find_component`.
- `programs` (``programs.py``): a notebook as a program: its export cached by code, checked for
  its one declaration without running it, loaded where a file is expected.
- `claims` (``claims.py``): a notebook's measured sentences as checks (`claim`, `within`).

Only `display` is imported with the package; the others load when named.

Example:
    >>> from dynamo_nb.notebook import NOTEBOOK_ONLY_TAG, in_notebook
    >>> NOTEBOOK_ONLY_TAG, in_notebook()
    ('notebook-only', False)
"""

from __future__ import annotations

from .display import NOTEBOOK_ONLY_TAG, PngDisplay, in_notebook, widget_with_plain_text

__all__ = ["NOTEBOOK_ONLY_TAG", "PngDisplay", "in_notebook", "widget_with_plain_text"]
