"""Every docstring example of the library runs and shows what it says.

Examples that need running services are written as plain code blocks (``Example::``), not as
doctests; no example is skipped.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import dynamo_nb

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(dynamo_nb.__path__, "dynamo_nb.")
    if not info.name.endswith(("__main__", ".parent_guard"))  # programs, not importable modules
)


def examples(module_name: str) -> int:
    finder = doctest.DocTestFinder()
    return sum(len(test.examples) for test in finder.find(importlib.import_module(module_name)))


@pytest.mark.parametrize("module", [m for m in MODULES if examples(m)])
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(
        importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0


def test_no_example_is_skipped() -> None:
    skipped = [
        name
        for name in MODULES
        if "doctest: +SKIP" in (importlib.import_module(name).__loader__.get_source(name) or "")  # type: ignore[union-attr]
    ]
    assert skipped == [], f"write these examples as code blocks (Example::) or make them run: {skipped}"


def test_most_modules_show_an_example() -> None:
    without = [m for m in MODULES if not examples(m)]
    assert len(without) < len(MODULES) / 2, without
