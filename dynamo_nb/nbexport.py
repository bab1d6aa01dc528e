"""nbconvert preprocessor that drops notebook-only cells when a notebook becomes a script.

Installing dynamo_nb puts ``jupyter-config/jupyter_nbconvert_config.json`` into the
environment's ``etc/jupyter``; it adds this preprocessor to the Python exporter only, so a
plain ``jupyter nbconvert --to script notebooks/01_runtime_basics.ipynb`` (from any folder)
writes a runnable program, while HTML and notebook exports keep every cell. (Jupyter no
longer reads config files from the working folder, so the file is installed, not found.)

Example:
    jupyter nbconvert --to script notebooks/01_runtime_basics.ipynb
"""

from __future__ import annotations

from typing import Any

from nbconvert.preprocessors import Preprocessor

from .notebook import NOTEBOOK_ONLY_TAG

__all__ = ["RemoveNotebookOnlyCells"]


class RemoveNotebookOnlyCells(Preprocessor):
    """Remove every cell tagged ``notebook-only``."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        nb.cells = [
            cell for cell in nb.cells if NOTEBOOK_ONLY_TAG not in cell.get("metadata", {}).get("tags", [])
        ]
        return nb, resources
