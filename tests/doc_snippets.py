"""Run a page's Python snippets as a reader would paste them: in order, each with its own
imports (a snippet sees only the names the earlier ones defined, not what they imported), top-level
``await`` allowed, as in a notebook cell."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_snippets(page: Path) -> list[str]:
    """The page's ```python blocks, in order."""
    return FENCE.findall(page.read_text())


def defined_names(code: str) -> set[str]:
    """What a snippet defines at top level (functions, classes, assigned names), not its imports."""
    names: set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


async def run_snippets(
    page: Path, given: dict[str, Any] | None = None, *, folder: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Run the page's snippets with ``given`` names (what the prose says the reader has: a trace,
    a running frontend's URL); every name they defined. ``folder``: (the page's folder, the
    test's), so a test writes where it may and leaves no files behind."""
    carried = dict(given or {})
    for index, code in enumerate(python_snippets(page)):
        if folder is not None:
            code = code.replace(*folder)
        namespace = {"__name__": f"snippet_{index}", **carried}
        compiled = compile(
            code, f"{page.name} snippet {index + 1}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        result = eval(compiled, namespace)
        if inspect.iscoroutine(result):
            await result
        carried.update({name: namespace[name] for name in defined_names(code) if name in namespace})
    return carried
