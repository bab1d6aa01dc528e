"""nbconvert preprocessor that drops notebook-only cells (and the prose that introduces only them)
when a notebook becomes a script.

Installing dynamo_nb puts ``jupyter-config/jupyter_nbconvert_config.json`` into the
environment's ``etc/jupyter``; it adds `RemoveNotebookOnlyCells` to the Python exporter and
`PythonScriptWithoutLanguageInfo` to the plain script exporter, so a plain ``jupyter nbconvert
--to script notebooks/01_runtime_basics.ipynb`` (from any folder) writes a runnable ``.py``
program — also for a notebook that never ran in a kernel (written with ``nbformat``: no
``language_info``, which nbconvert reads to pick the Python exporter) — while HTML and notebook
exports keep every cell. (Jupyter no longer reads config files from the working folder, so the
file is installed, not found.)

Example:
    jupyter nbconvert --to script notebooks/01_runtime_basics.ipynb
"""

from __future__ import annotations

from typing import Any

from nbconvert.preprocessors import Preprocessor

from ..jupyter import kept_cells

__all__ = ["PythonScriptWithoutLanguageInfo", "RemoveNotebookOnlyCells", "is_python_notebook", "kept_cells"]


class RemoveNotebookOnlyCells(Preprocessor):
    """Remove every cell tagged ``notebook-only``, and the prose that only introduces such cells: a
    markdown cell stays when a code cell that stays follows it before the next markdown cell (or
    it is the notebook's first cell, its title)."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        nb.cells = kept_cells(nb.cells)
        return nb, resources


class PythonScriptWithoutLanguageInfo(Preprocessor):
    """For the plain script exporter, which nbconvert uses when a notebook has no
    ``language_info`` (it never ran in a kernel): a notebook whose kernel spec is Python, or that
    names none, is exported as Python — a ``.py`` file (not ``.txt``) without its ``notebook-only``
    cells. Other languages are left as they are."""

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if is_python_notebook(nb.get("metadata", {})):
            from nbconvert.filters import ipython2python

            nb.cells = kept_cells(nb.cells)
            for cell in nb.cells:  # %magic and !shell lines become calls, as the Python exporter makes them
                if cell.get("cell_type") == "code":
                    cell.source = ipython2python(cell.source)
            resources["output_extension"] = ".py"
        return nb, resources


def is_python_notebook(metadata: dict[str, Any]) -> bool:
    """Whether a notebook's metadata says Python, or says no language at all.

    Example:
        >>> is_python_notebook({}), is_python_notebook({"kernelspec": {"name": "ir", "language": "R"}})
        (True, False)
    """
    language = metadata.get("language_info", {}).get("name") or metadata.get("kernelspec", {}).get("language")
    return str(language or "python").lower() == "python"
