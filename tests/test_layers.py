"""Imports only go down: each module of the package imports only from its own layer and the
layers below, as the table in ``docs/architecture.md`` assigns them (every import counts: at
module level, inside functions and under ``TYPE_CHECKING``), and no import circle joins two
packages; at run time (type annotations aside) none joins two modules either."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "dynamo_nb"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def layers(text: str) -> dict[str, int]:
    """``{part: layer}`` from the map's layer table (a part: ``runtime`` for `runtime/`,
    ``flags`` for `flags.py`, ``dynamo_nb`` for the facade)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    found = {}
    for number, parts in re.findall(r"^\| (\d+) \| (.+) \|$", section, re.M):
        for name in re.findall(r"`([\w./]+)`", parts):
            part = name.rstrip("/").removesuffix(".py").replace("/", ".")
            found["dynamo_nb" if part == "__init__" else part] = int(number)
    return found


TABLE = layers(ARCHITECTURE.read_text())


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level(nodes: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block)


def _anywhere(tree: ast.Module, *, typing: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of a module, inside functions too; under ``TYPE_CHECKING`` only if ``typing``."""
    checking = (
        set()
        if typing
        else {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
    )
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in checking:
            yield node


def imports_of(
    path: Path, source: str | None = None, *, lazy: bool = False, typing: bool = False
) -> set[str]:
    """The modules of the package that ``path`` imports when it is imported (``lazy``: or when
    one of its functions runs; ``typing``: or only for a type checker, under ``TYPE_CHECKING``)."""
    name = module_name(path)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    tree = ast.parse(source if source is not None else path.read_text())
    nodes = _anywhere(tree, typing=typing) if lazy or typing else _module_level(tree.body)
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("dynamo_nb")}
            continue
        base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
        if not node.level:
            base = node.module or ""
        if not base.startswith("dynamo_nb"):
            continue
        for alias in node.names:  # `from . import rooms`: the submodule
            submodule = f"{base}.{alias.name}"
            found.add(submodule if _is_module(submodule) else base)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def part_of(name: str) -> str:
    """The part of the table a module belongs to: the longest one naming it or a package above it
    (``dynamo_nb.notebook.display`` → ``notebook.display``, ``dynamo_nb.runtime.client`` →
    ``runtime``)."""
    parts = name.split(".")[1:]
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in TABLE:
            return ".".join(parts[:end])
    return parts[0] if parts else "dynamo_nb"


def upward_imports(table: dict[str, int], graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} (layer {table[part_of(source)]}) imports {target} (layer {table[part_of(target)]})"
        for source, targets in graph.items()
        for target in targets
        if table[part_of(target)] > table[part_of(source)]
    )


def reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """What ``start`` leads to through ``edges``."""
    seen, stack = set(), [start]
    while stack:
        for after in edges.get(stack.pop(), ()):
            if after not in seen:
                seen.add(after)
                stack.append(after)
    return seen


def circles(graph: dict[str, set[str]], key=lambda name: name) -> list[tuple[str, str]]:
    """Pairs (under ``key``: a module, or its part) that reach each other, a package and its own
    modules aside."""
    edges: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            if not (target.startswith(source + ".") or source.startswith(target + ".")):
                edges.setdefault(key(source), set()).add(key(target))

    return sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a != b and a in reach(edges, b)})


def package_graph(*, lazy: bool = False, typing: bool = False) -> dict[str, set[str]]:
    return {
        module_name(path): imports_of(path, lazy=lazy, typing=typing)
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_part_of_the_package_has_a_layer_and_is_a_package_or_a_top_level_module() -> None:
    table = layers(ARCHITECTURE.read_text())
    parts = {part_of(name) for name in package_graph()}
    assert parts - set(table) == set(), "parts with no layer in docs/architecture.md"
    assert set(table) - parts == set(), "layers naming parts that do not exist"
    assert [part for part in table if "." in part] == [], "a module inside a package with a layer of its own"


def test_imports_only_go_down_counting_every_import() -> None:
    """Module level, inside functions and under ``TYPE_CHECKING``: a lower layer that needs a
    higher one's object names what it uses as a Protocol of its own, or is told it."""
    assert upward_imports(layers(ARCHITECTURE.read_text()), package_graph(lazy=True, typing=True)) == []


def test_every_import_of_the_package_names_a_module_that_exists() -> None:
    """A lazy import of a module that moved fails only when its function runs: found here."""
    missing = sorted(
        f"{source} imports {target}"
        for source, targets in package_graph(lazy=True, typing=True).items()
        for target in targets
        if not _is_module(target)
    )
    assert missing == []


def test_no_import_circle_joins_two_packages_or_two_modules() -> None:
    graph = package_graph()
    assert circles(graph, key=part_of) == []
    assert circles(graph) == []
    assert circles(package_graph(lazy=True, typing=True), key=part_of) == []  # type annotations too


def test_no_import_circle_even_through_imports_inside_functions() -> None:
    """A lazy import (inside a function) may reach up to an optional part, but never back into a
    module that imports the caller: two modules needing each other are one concept split wrong."""
    assert circles(package_graph(lazy=True)) == []


def test_an_upward_import_and_a_circle_are_found() -> None:
    table = layers(ARCHITECTURE.read_text())
    graph = package_graph()
    graph["dynamo_nb.runtime.client"] = graph["dynamo_nb.runtime.client"] | {"dynamo_nb.frontend.app"}
    assert any(
        "runtime.client (layer 2) imports dynamo_nb.frontend.app" in line
        for line in upward_imports(table, graph)
    )
    assert ("frontend", "runtime") in circles(graph, key=part_of)
    lazy = "def f():\n    from .frontend import app\nif TYPE_CHECKING:\n    from .http import parser\n"
    assert imports_of(PACKAGE / "flags.py", lazy) == set()
    assert imports_of(PACKAGE / "flags.py", lazy, lazy=True) == {"dynamo_nb.frontend.app"}
    assert imports_of(PACKAGE / "flags.py", lazy, typing=True) == {
        "dynamo_nb.frontend.app",
        "dynamo_nb.http.parser",
    }


@pytest.mark.processes
def test_building_a_workers_parser_loads_no_http_app_no_netns_harness_no_stub_server() -> None:
    """A worker program imports the kit and builds its flags: the frontend's HTTP app, the
    multi-host harness (network namespaces) and the benchmark stub server stay unloaded."""
    import subprocess
    import sys

    probe = (
        "import sys, dynamo_nb\n"
        "from dynamo_nb.flags import hf_worker_parser\n"
        "hf_worker_parser().parse_args([])\n"
        "print(sorted(m for m in sys.modules if m.startswith(("
        "'dynamo_nb.frontend.app', 'dynamo_nb.testing.hosts', "
        "'dynamo_nb.testing.netswitch', 'dynamo_nb.testing.stub_server'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout


def modules_in_circles(graph: dict[str, set[str]]) -> set[str]:
    """Every module on an import circle of ``graph``, a package's own modules included (its
    ``__init__`` runs their imports)."""
    return {name for name in graph if name in reach(graph, name)}


def test_no_import_circle_of_any_length_outside_type_checking() -> None:
    """Through lazy imports and package ``__init__`` files too: an optional backend plugs in by
    name or registers itself (as `dynamo_nb.on_dynamo` does), it is never imported back."""
    assert modules_in_circles(package_graph(lazy=True)) == set()
    looped = package_graph(lazy=True)
    looped["dynamo_nb.runtime.program"] = looped["dynamo_nb.runtime.program"] | {"dynamo_nb.on_dynamo"}
    assert {"dynamo_nb.runtime.program", "dynamo_nb.on_dynamo.worker"} <= modules_in_circles(looped)
