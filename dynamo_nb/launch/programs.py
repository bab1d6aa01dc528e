"""A notebook as a program: its plain ``jupyter nbconvert --to script`` export, cached by content,
checked for its one component, and loaded where a file is expected.

- `export_notebook`: runs ``python -m jupyter nbconvert --to script`` (the path a user takes; the
  installed config drops the ``notebook-only`` cells) into a cache folder named by the notebook's
  content hash, so a notebook is exported once per change;
- `check_program_source`: reads an exported program's source (`ast`, nothing runs) and says
  what it lacks: a component declaration (`dynamo_nb.notebook.component_program`), one where two are
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
    'worker'
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

from ..errors import ConfigError
from ..extras import require_extra
from .declarations import DECLARED_KINDS, RUNNABLE_KINDS, pick_declaration, split_reference

__all__ = [
    "check_exported_cells",
    "check_program_source",
    "declarations",
    "export_cache",
    "export_command",
    "export_notebook",
    "import_program",
    "program_file",
    "reference_program",
]

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
    check_exported_cells(path)
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent.parent) as scratch:
        command = [sys.executable, "-m", *export_command(path.resolve(), Path(scratch))]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"exporting {path} took over 120 s: {' '.join(command)}") from None
        written = Path(scratch) / f"{path.stem}.py"
        others = sorted(p.name for p in Path(scratch).iterdir() if p.stem == path.stem)
        if done.returncode == 0 and not written.is_file() and others:
            raise ConfigError(
                f"jupyter nbconvert --to script {path} wrote {others[0]}, not {path.stem}.py: the notebook "
                "names no language (it never ran in a kernel) and dynamo_nb's nbconvert config, which "
                "exports such a notebook as Python, is not installed in this environment: reinstall "
                'dynamo_nb (pip install -e .), or add "language_info": {"name": "python"} to its metadata'
            )
        if done.returncode != 0 or not written.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise ConfigError(f"jupyter nbconvert --to script {path} failed:\n{tail}")
        try:
            source = written.read_text()
            compile(source, str(written), "exec")  # compiled, not run: a top-level await fails here
        except SyntaxError as exc:
            line = source.splitlines()[(exc.lineno or 1) - 1].strip()
            raise ConfigError(
                f"{path}: its export is not plain Python ({exc.msg}: {line!r}): fix that line, or tag "
                "its cell notebook-only if only a kernel runs it (and check that dynamo_nb is installed, "
                "which installs the nbconvert config that drops those cells)"
            ) from None
        target.parent.mkdir(exist_ok=True)
        os.replace(written, target)  # atomic: a reader never sees half a file
    return target


def check_exported_cells(notebook: Path) -> None:
    """Refuse a notebook whose script export would not be plain Python: a code cell that is kept
    (not tagged ``notebook-only``) and awaits at top level (or uses ``async with``/``async for``
    there), which only a kernel runs. The `ConfigError` names the cell (its number, counting every
    cell from 1, and its first line) and the tag to add. IPython's ``%``/``!`` lines are skipped
    here (the export turns them into calls), and so is any other syntax error: the compile of the
    export reports it."""
    from ..jupyter import kept_cells

    cells = _cells(notebook)
    kept = {id(cell) for cell in kept_cells(cells)}
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code" or id(cell) not in kept:
            continue
        source = _source(cell)
        if source.lstrip().startswith("%%"):  # a cell magic: the whole cell is IPython's
            continue
        code = "\n".join(
            line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!")) else line
            for line in source.splitlines()
        )
        try:
            compile(code, f"{notebook.name}, cell {number}", "exec")
        except SyntaxError as exc:
            message = exc.msg or ""
            if "outside" in message and any(word in message for word in ("await", "async", "asynchronous")):
                first = source.strip().splitlines()[0]
                raise ConfigError(
                    f"{notebook}: cell {number} ({first!r}) awaits at top level, which only a kernel "
                    f'runs: tag that cell notebook-only (View > Cell Toolbar > Tags, or metadata "tags": '
                    f'["notebook-only"]) so its export leaves it out, or move the await into a function'
                ) from None
            # other syntax (IPython's own, say) is left to the exporter and the compile of its output


def _cells(notebook: Path) -> list[dict]:
    """A notebook file's cells (its JSON), or a `ConfigError` naming the file."""
    try:
        return json.loads(notebook.read_text()).get("cells", [])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{notebook} is not a notebook (JSON): {exc}") from None


def _source(cell: dict) -> str:
    """A cell's source: nbformat stores it as one string or as a list of lines."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _code_digest(notebook: Path) -> str:
    """A hash of what the export is made of: the cells' types, sources and tags (not their outputs,
    so re-running a notebook keeps its export)."""
    parts = [
        (c.get("cell_type"), _source(c), c.get("metadata", {}).get("tags", [])) for c in _cells(notebook)
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def declarations(source: str, where: str) -> dict[str, str]:
    """The module-level component declarations in ``source`` (nothing is run): name → kind
    (``"handler"``, ``"engine"``, ``"routing policy"``).

    Example:
        >>> source = "worker = EngineProgram(Shout)" + chr(10) + "policy = RoutingPolicy(pick)"
        >>> declarations(source, "mine.ipynb")
        {'worker': 'engine', 'policy': 'routing policy'}
    """
    tree = ast.parse(source, filename=where)
    declared: dict[str, str] = {}

    def called(node: ast.expr | None) -> str | None:
        target = node.func if isinstance(node, ast.Call) else node
        return target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)

    for node in tree.body:
        targets: list[ast.expr] = []
        kind = None
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            targets, kind = node.targets, called(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
            targets, kind = [node.target], called(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # @RoutingPolicy def pick(...)
            kinds = [called(decorator) for decorator in node.decorator_list]
            kind = next((k for k in kinds if k in DECLARED_KINDS), None)
            targets = [ast.Name(id=node.name)]
        if kind in DECLARED_KINDS:
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    declared[target.id] = DECLARED_KINDS[kind]
    return declared


def check_program_source(source: str, where: str, *, runnable: bool = True, name: str | None = None) -> str:
    """The name of the declaration in ``source`` that a worker program (``runnable``) or a routing
    policy reference picks (`dynamo_nb.launch.declarations.pick_declaration`: ``name``, else the only
    one of that kind), read without running anything. A worker also needs an ``if __name__ ==
    "__main__":`` entry point that runs it; a hand-written component's ``build_parser()`` stands in
    for a declaration. Else a `ConfigError` naming ``where`` and what to change."""
    tree = ast.parse(source, filename=where)
    declared = declarations(source, where)
    hand_written = any(isinstance(n, ast.FunctionDef) and n.name == "build_parser" for n in tree.body)
    if runnable and hand_written and name is None and not any(k in RUNNABLE_KINDS for k in declared.values()):
        picked = "main"
    else:
        picked = pick_declaration(declared, where, runnable=runnable, name=name)
    if runnable:
        guards = [node for node in tree.body if _is_main_guard(node)]
        if not guards:
            raise ConfigError(
                f'{where} has no entry point: end it with a cell `if __name__ == "__main__" and not '
                f"in_notebook(): sys.exit({picked}.run())`"
            )
        run_by_guard = {n.id for guard in guards for n in ast.walk(guard) if isinstance(n, ast.Name)} & set(
            declared
        )
        if name is not None and name not in run_by_guard:
            raise ConfigError(
                f"{where}:{name}: its entry point runs {', '.join(sorted(run_by_guard)) or 'something else'}, "
                f"not {name}: run {name} there (sys.exit({name}.run())), or name that one"
            )
    return picked


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__" …:`` at module level."""
    test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
    return "__name__" in test and "__main__" in test


def program_file(path: Path, *, where: str | None = None, name: str | None = None) -> Path:
    """What runs for ``path``: a notebook's checked export (`export_notebook`, then
    `check_program_source` for a worker, ``name`` if one is given), a ``.py`` file as it is
    (checked too when ``name`` is given)."""
    if path.suffix != ".ipynb":
        if name is not None:
            check_program_source(path.read_text(), f"{where or path}", name=name)
        return path
    exported = export_notebook(path)
    check_program_source(exported.read_text(), where or str(path), name=name)
    return exported


def reference_program(reference: str, cwd: Path) -> Path:
    """What runs for the reference ``FILE`` or ``FILE:NAME`` (FILE found as `dynamo_nb.launch`
    finds programs, from ``cwd``): `program_file` of it, errors naming FILE.

    Example::

        reference_program("notebooks/10_your_own_engine.ipynb:worker", Path.cwd())  # its checked export
    """
    from .paths import resolve_program

    file, name = split_reference(reference)
    return program_file(resolve_program(file, cwd), where=file, name=name)


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
