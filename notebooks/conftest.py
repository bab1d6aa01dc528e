"""Every notebook here is a test, run by nbval in a kernel of this environment with the outputs
sanitized by ``sanitize.cfg``: collected here only, so nbval runs where notebooks are (``pytest``,
``pytest notebooks/`` or one notebook's path), with no flag to pass. The vLLM notebooks are
marked ``vllm`` and ``long`` (engine starts: an opt-in group, see the root conftest.py), the
ones with half a minute or more of live traffic ``long`` (capacity planning, the planner on a trace,
the retune loop: ``LONG_NOTEBOOKS``), the one on NVIDIA Dynamo ``dynamo``
(it needs Dynamo's packages)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from nbval.plugin import IPyNbFile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from helpers import LONG_NOTEBOOKS, NEEDS_DYNAMO, NEEDS_VLLM  # noqa: E402  (tests/ is on the path from here on)

CELL_TIMEOUT = 300.0
# nbval waits 5 s for each output message of a finished cell; on a busy 2-core machine a live
# chart's last redraw can take longer than that (the cell itself has CELL_TIMEOUT)
OUTPUT_TIMEOUT = 60
NBVAL_DEFAULT_CELL_TIMEOUT = 2000.0


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> IPyNbFile | None:
    option = parent.config.option
    if file_path.suffix != ".ipynb" or option.nbval or option.nbval_lax:
        return None  # not a notebook, or nbval collects it itself (--nbval given)
    option.nbval_current_env = True
    option.nbval_sanitize_with = option.nbval_sanitize_with or str(HERE / "sanitize.cfg")
    if option.nbval_cell_timeout == NBVAL_DEFAULT_CELL_TIMEOUT:
        option.nbval_cell_timeout = CELL_TIMEOUT
    return IPyNbFile.from_parent(parent, path=file_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix != ".ipynb":
            continue
        item.add_marker(pytest.mark.processes)  # a kernel, and the workers it launches
        if hasattr(item, "output_timeout"):
            item.output_timeout = OUTPUT_TIMEOUT
        if item.path.stem in NEEDS_VLLM:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.long)
        if item.path.stem in NEEDS_DYNAMO:
            item.add_marker(pytest.mark.dynamo)
        if item.path.stem in LONG_NOTEBOOKS:
            item.add_marker(pytest.mark.long)
