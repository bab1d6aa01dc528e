"""The project says ``requires-python = ">=3.10"``: nothing in the package, the components, the
benchmarks, the tests or the notebooks' cells uses what only a newer Python has (``asyncio.timeout``,
``TaskGroup``, ``except*``, ``tomllib``, ``typing.Self`` …), found by reading their syntax trees."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from helpers import ROOT

# module → names it gained after 3.10 (a use of any of them needs a newer Python)
NEWER = {
    "asyncio": {"timeout", "timeout_at", "Timeout", "TaskGroup", "Runner"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override", "TypeAliasType"},
    "enum": {"StrEnum", "ReprEnum", "verify", "EnumCheck"},
    "datetime": {"UTC"},
    "itertools": {"batched"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "operator": {"call"},
}  # fmt: skip
NEWER_MODULES = {"tomllib", "wsgiref.types"}
NEWER_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
NEWER_SYNTAX = {"TryStar": "except*", "TypeAlias": "a type statement"}
REQUIRES = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())


def newer_python_uses(tree: ast.AST) -> list[str]:
    """What ``tree`` uses that Python 3.10 lacks, with line numbers."""
    found = []
    aliases = {}  # local name → module, for `import asyncio as aio`
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
                if alias.name in NEWER_MODULES:
                    found.append(f"line {line}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module in NEWER_MODULES:
                found.append(f"line {line}: from {node.module} import …")
            for alias in node.names:
                if alias.name in NEWER.get(node.module, ()):
                    found.append(f"line {line}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id, node.value.id)
            if node.attr in NEWER.get(module, ()):
                found.append(f"line {line}: {module}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            found.append(f"line {line}: {node.id}")
        elif type(node).__name__ in NEWER_SYNTAX:
            found.append(f"line {line}: {NEWER_SYNTAX[type(node).__name__]}")
        elif getattr(node, "type_params", None):
            found.append(f"line {line}: type parameters (PEP 695)")
    return found


SOURCES = sorted(
    path
    for folder in ("dynamo_nb", "components", "benchmarks", "tests", "models")
    for path in (ROOT / folder).rglob("*.py")
    if "build" not in path.parts
)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_floor_is_310() -> None:
    assert REQUIRES is not None and (int(REQUIRES[1]), int(REQUIRES[2])) == (3, 10)


def test_the_check_finds_what_310_lacks() -> None:
    source = "import asyncio as aio\nfrom typing import Self\nasync def f():\n    async with aio.timeout(1):\n        pass\n"
    assert newer_python_uses(ast.parse(source)) == [
        "line 2: from typing import Self",
        "line 4: asyncio.timeout",
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_sources_run_on_python_310(path: Path) -> None:
    assert not newer_python_uses(ast.parse(path.read_text(), filename=str(path)))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_cells_run_on_python_310(notebook: Path) -> None:
    for index, cell in enumerate(nbformat.read(notebook, 4).cells):
        if cell.cell_type == "code":
            tree = compile(
                cell.source, f"cell {index}", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
            assert not newer_python_uses(tree), f"cell {index}: {newer_python_uses(tree)}"
