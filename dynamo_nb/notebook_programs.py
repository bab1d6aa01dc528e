"""A notebook as a program: its plain ``jupyter nbconvert --to script`` export, cached by content,
checked for its one component, and loaded where a file is expected.

- `export_notebook`: runs ``python -m jupyter nbconvert --to script`` (the path a user takes; the
  installed config drops the ``notebook-only`` cells) into a cache folder named by the notebook's
  content hash, so a notebook is exported once per change;
- `check_program_source`: reads an exported program's source (`ast`, nothing runs) and says
  what it lacks: a component declaration (`dynamo_nb.component_program`), one where two are
  declared, the entry point of a worker;
- `program_file`: what a graph or a launcher runs for a path: a ``.py`` file as it is, a
  notebook's checked export;
- `load_component`: a file's declared component (``FILE`` or ``FILE:NAME``, a ``.py`` file or a
  notebook), imported without running its ``__main__`` part: how a frontend loads
  ``--router-policy``.

The cache key is a hash of the cells' code and tags (outputs do not count). The cache is
``$DYN_NB_EXPORT_CACHE``, else ``$XDG_CACHE_HOME/dynamo_nb/exports`` (``~/.cache``).

Example:
    >>> source = 'worker = EngineProgram(Shout)\\nif __name__ == "__main__":\\n    sys.exit(worker.run())'
    >>> check_program_source(source, "shout.ipynb")
    ['worker']
    >>> check_program_source("x = 1", "empty.ipynb")
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: empty.ipynb defines no worker (HandlerProgram or EngineProgram): ...
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import ConfigError
from .extras import require_extra

if TYPE_CHECKING:
    from .component_program import ComponentProgram

__all__ = [
    "check_program_source",
    "export_cache",
    "export_command",
    "export_notebook",
    "import_program",
    "load_component",
    "program_file",
]

WORKER_DECLARATIONS = ("HandlerProgram", "EngineProgram")
POLICY_DECLARATIONS = ("RoutingPolicy",)
_MODULES: dict[Path, ModuleType] = {}


def export_cache() -> Path:
    """Where exports are kept: ``$DYN_NB_EXPORT_CACHE``, else ``$XDG_CACHE_HOME/dynamo_nb/exports``."""
    configured = os.environ.get("DYN_NB_EXPORT_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dynamo_nb" / "exports"


def export_command(notebook: Path, output_dir: Path) -> list[str]:
    """The plain nbconvert command line that exports ``notebook`` into ``output_dir``."""
    return ["jupyter", "nbconvert", "--to", "script", str(notebook), "--output-dir", str(output_dir)]


def export_notebook(notebook: str | os.PathLike[str]) -> Path:
    """The notebook's exported program (``<cache>/<stem>-<hash>/<stem>.py``), exported now unless
    this content was exported before.

    Raises `ConfigError` when nbconvert fails or leaves a cell that is not plain Python (a top-level
    ``await`` in a cell not tagged ``notebook-only``), and `MissingExtraError` without nbconvert.
    """
    path = Path(notebook)
    if path.suffix != ".ipynb" or not path.is_file():
        raise ConfigError(f"{path} is not a notebook file (.ipynb)")
    digest = _code_digest(path)
    target = export_cache() / f"{path.stem}-{digest}" / f"{path.stem}.py"
    if target.is_file():
        return target
    require_extra("nbconvert", f"exporting {path.name}", extra="notebook")
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent.parent) as scratch:
        command = [sys.executable, "-m", *export_command(path.resolve(), Path(scratch))]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"exporting {path} took over 120 s: {' '.join(command)}") from None
        written = Path(scratch) / f"{path.stem}.py"
        if done.returncode != 0 or not written.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ConfigError(f"jupyter nbconvert --to script {path} failed:\n{tail}")
        try:
            source = written.read_text()
            compile(source, str(written), "exec")  # compiled, not run: a top-level await fails here
        except SyntaxError as exc:
            line = source.splitlines()[(exc.lineno or 1) - 1].strip()
            raise ConfigError(
                f"{path}: its export is not plain Python ({exc.msg}: {line!r}): tag the cell "
                "that awaits at top level notebook-only (and check that dynamo_nb is installed, which "
                "installs the nbconvert config that drops those cells)"
            ) from None
        target.parent.mkdir(exist_ok=True)
        os.replace(written, target)  # atomic: a reader never sees half a file
    return target


def _code_digest(notebook: Path) -> str:
    """A hash of what the export is made of: the cells' types, sources and tags (not their outputs,
    so re-running a notebook keeps its export)."""
    try:
        cells = json.loads(notebook.read_text()).get("cells", [])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{notebook} is not a notebook (JSON): {exc}") from None
    parts = [
        (c.get("cell_type"), "".join(c.get("source", "")), c.get("metadata", {}).get("tags", []))
        for c in cells
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def check_program_source(source: str, where: str, *, runnable: bool = True) -> list[str]:
    """The names of the module-level component declarations in ``source`` (nothing is run), after
    checking that it has what a worker program (``runnable``) or a routing policy needs:
    exactly one declaration of that kind (a hand-written component's ``build_parser()`` counts),
    and for a worker, an ``if __name__ == "__main__":`` entry point. Else a `ConfigError`
    naming ``where`` and what is missing."""
    tree = ast.parse(source, filename=where)
    wanted = WORKER_DECLARATIONS if runnable else POLICY_DECLARATIONS
    declared: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            called = node.value.func
            name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", None)
            if name in (*WORKER_DECLARATIONS, *POLICY_DECLARATIONS):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        declared[target.id] = name
    matching = [key for key, kind in declared.items() if kind in wanted]
    hand_written = any(isinstance(n, ast.FunctionDef) and n.name == "build_parser" for n in tree.body)
    what = "worker (HandlerProgram or EngineProgram)" if runnable else "RoutingPolicy"
    if not matching and not (runnable and hand_written):
        others = [f"{key} = {kind}(...)" for key, kind in declared.items()]
        also = f" (it declares {', '.join(others)})" if others else ""
        raise ConfigError(
            f"{where} defines no {what}{also}: declare one in a cell that is exported (not tagged "
            f"notebook-only), e.g. worker = {wanted[-1]}(...)"
        )
    if len(matching) > 1:
        raise ConfigError(
            f"{where} declares {len(matching)} components ({', '.join(matching)}) where one is expected: "
            "keep one per notebook"
        )
    if runnable and not any(_is_main_guard(node) for node in tree.body):
        raise ConfigError(
            f'{where} has no entry point: end it with a cell `if __name__ == "__main__" and not '
            f"in_notebook(): sys.exit({matching[0] if matching else 'main'}.run())`"
        )
    return matching


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__" …:`` at module level."""
    test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
    return "__name__" in test and "__main__" in test


def program_file(path: Path, *, where: str | None = None) -> Path:
    """What runs for ``path``: a notebook's checked export (`export_notebook`, then
    `check_program_source` for a worker), anything else as it is."""
    if path.suffix != ".ipynb":
        return path
    exported = export_notebook(path)
    check_program_source(exported.read_text(), where or str(path))
    return exported


def load_component(
    reference: str, *, runnable: bool | None = None, cwd: Path | None = None
) -> ComponentProgram:
    """The component ``FILE`` or ``FILE:NAME`` declares (FILE a ``.py`` file or a notebook, found
    as `dynamo_nb.launch` finds programs), imported once; its ``__main__`` part does not run.

    Example::

        policy = load_component("notebooks/06_kv_aware_routing.ipynb:prefix_policy", runnable=False)
    """
    from .component_program import find_component
    from .launch.launcher import resolve_program

    file, _, name = reference.partition(":")
    path = resolve_program(file, cwd or Path.cwd())
    source_path = export_notebook(path) if path.suffix == ".ipynb" else path
    if not name and runnable is not None:
        check_program_source(source_path.read_text(), file, runnable=runnable)
    module = import_program(source_path, file)
    return find_component(vars(module), file, runnable=runnable, name=name or None)


def import_program(path: Path, where: str) -> ModuleType:
    """``path`` (a ``.py`` file) imported as a module of its own, once per file: its
    ``if __name__ == "__main__"`` part does not run. An error while importing is a `ConfigError`
    naming ``where``."""
    resolved = path.resolve()
    if resolved not in _MODULES:
        spec = importlib.util.spec_from_file_location(f"_dynamo_nb_loaded_{resolved.stem}", resolved)
        if spec is None or spec.loader is None:
            raise ConfigError(f"{where} cannot be loaded as a Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{where} failed while loading: {type(exc).__name__}: {exc}") from exc
        _MODULES[resolved] = module
    return _MODULES[resolved]
