"""Docs that cannot drift: every path ``docs/architecture.md`` names exists, and the error tree
drawn in ``dynamo_nb/errors.py`` and ``docs/api.md`` is the code's."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT

from dynamo_nb import errors

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PATH_LIKE = re.compile(r"`([A-Za-z_][\w./-]*(?:/|\.py|\.md|\.ya?ml|\.toml))`")
TREE_LINE = re.compile(r"^(?P<indent>[\s│├└─]*)(?P<name>[A-Z]\w+Error)\b")


def named_paths(text: str) -> list[tuple[str, list[Path]]]:
    """Each backquoted path of ``text`` with where it may live: from the repository root, from
    the package, or (a bare file name such as ``names.py``) beside the path named before it on
    the same line."""
    found = []
    for line in text.splitlines():
        folder: Path | None = None
        for name in PATH_LIKE.findall(line):
            candidates = [ROOT / name, ROOT / "dynamo_nb" / name]
            if folder is not None:
                candidates.append(folder / name)
            found.append((name, candidates))
            existing = next((c for c in candidates if c.exists()), None)
            if existing is not None and "/" in name:
                folder = existing if existing.is_dir() else existing.parent
    return found


def test_every_path_the_architecture_map_names_exists() -> None:
    named = named_paths(ARCHITECTURE.read_text())
    assert len(named) > 40  # the map names the files, not only folders
    missing = [name for name, candidates in named if not any(c.exists() for c in candidates)]
    assert missing == []


WHERE_IS = (
    "the request pipeline",
    "migration",
    "admission control",
    "the handoff, prefill side",
    "where a decode fetches its KV",
    "what a new engine must implement",
    "a flag, from the command line",
    "the tests, and which to run",
)
"""The questions a newcomer asks first: each has a row in the map's "Where is …?" table."""


def test_where_is_answers_each_question_with_paths() -> None:
    rows = {
        line.split("|")[1].strip(): line.split("|")[2]
        for line in ARCHITECTURE.read_text().splitlines()
        if line.startswith("| ") and line.count("|") >= 3
    }
    for question in WHERE_IS:
        answer = next((a for q, a in rows.items() if q.startswith(question)), None)
        assert answer is not None, f"docs/architecture.md: no row for {question!r}"
        assert PATH_LIKE.search(answer), f"the row for {question!r} names no path"


def test_a_missing_path_is_found_missing() -> None:
    assert named_paths("see `dynamo_nb/nowhere.py`")[0][1][0].exists() is False


def drawn_tree(text: str) -> set[tuple[str, str]]:
    """(error, parent) pairs of an error tree drawn with box characters, four columns a level."""
    pairs: set[tuple[str, str]] = set()
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match["indent"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            pairs.add((match["name"], stack[-1][1]))
        stack.append((depth, match["name"]))
    return pairs


def code_tree() -> set[tuple[str, str]]:
    pairs = set()
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.DynamoNBError):
            for base in cls.__bases__:
                if issubclass(base, errors.DynamoNBError):
                    pairs.add((cls.__name__, base.__name__))
    return pairs


def test_the_error_tree_in_the_docstring_and_the_api_docs_is_the_codes() -> None:
    code = code_tree()
    assert ("OverloadedError", "RequestError") in code and len(code) > 25
    docstring = errors.__doc__ or ""
    assert drawn_tree(docstring) == code
    api = (ROOT / "docs" / "api.md").read_text()
    assert drawn_tree(api) == code


def test_a_misplaced_error_is_found() -> None:
    tree = "DynamoNBError\n├── ConfigError\n│   └── RoutingError\n"
    assert drawn_tree(tree) == {("ConfigError", "DynamoNBError"), ("RoutingError", "ConfigError")}


REPEATABLE_NAMES = {"__init__.py", "__main__.py", "base.py"}
"""File names that may repeat across packages: package markers, and ``base.py`` (each package's
protocol: a request plane's, a discovery's, an engine's, a router's)."""


def test_module_names_do_not_collide_across_packages() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "dynamo_nb").rglob("*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {
        name: paths for name, paths in seen.items() if len(paths) > 1 and name not in REPEATABLE_NAMES
    }
    assert repeated == {}


PACKAGE = ROOT / "dynamo_nb"


def modules_missing_from_the_map(lines: list[str]) -> list[str]:
    """The modules of the package that ``lines`` (docs/architecture.md) never names: by their path
    from ``dynamo_nb/`` in backquotes, or by file name on a line that also names their folder
    (``runtime/planes/`` … ``tcp.py``); a top-level module by its file name."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        relative, folder = path.relative_to(PACKAGE).as_posix(), path.parent.relative_to(PACKAGE).as_posix()
        if folder == ".":
            named = any(f"`{path.name}`" in line for line in lines)
        else:
            named = any(
                f"`{relative}`" in line or (f"`{path.name}`" in line and f"{folder}/" in line)
                for line in lines
            )
        if not named:
            missing.append(relative)
    return missing


def modules_missing_from_their_package_docstring() -> list[str]:
    """Each package's modules (``name.py``) and subpackages (``name/``) its ``__init__`` docstring
    does not name in double backquotes."""
    import ast

    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if init.parent == PACKAGE:
            continue  # the facade's docstring is the package's introduction
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        for child in sorted(init.parent.iterdir()):
            if child.suffix == ".py" and child.name not in ("__init__.py", "__main__.py"):
                needle = f"``{child.name}``"
            elif child.is_dir() and (child / "__init__.py").exists():
                needle = f"``{child.name}/``"
            else:
                continue
            if needle not in docstring:
                missing.append(f"{init.parent.relative_to(PACKAGE).as_posix()}: {needle}")
    return missing


def test_the_map_names_every_module() -> None:
    assert modules_missing_from_the_map(ARCHITECTURE.read_text().splitlines()) == []


def test_a_module_left_off_the_map_is_found() -> None:
    lines = [line for line in ARCHITECTURE.read_text().splitlines() if "security.py" not in line]
    assert "runtime/security.py" in modules_missing_from_the_map(lines)


def test_each_package_docstring_names_its_modules() -> None:
    assert modules_missing_from_their_package_docstring() == []


def test_the_map_says_who_may_connect() -> None:
    rows = dict(re.findall(r"^\| ([^|]+?) \| (.+) \|$", ARCHITECTURE.read_text(), re.M))
    assert "security.py" in rows["who may connect"] and "docs/security.md" in rows["who may connect"]


def test_every_dotted_name_the_package_text_names_exists() -> None:
    """A docstring's ``dynamo_nb.x.y`` reference names a module or an object that exists (a
    reference left behind by a move or a rename is found here)."""
    import importlib

    stale = set()
    for path in sorted((ROOT / "dynamo_nb").rglob("*.py")):
        for reference in re.findall(r"`(dynamo_nb(?:\.[A-Za-z_]\w*)+)`", path.read_text()):
            parts = reference.split(".")
            for end in range(len(parts), 0, -1):
                try:
                    found: object = importlib.import_module(".".join(parts[:end]))
                except ImportError:
                    continue
                for name in parts[end:]:
                    found = getattr(found, name, None)
                if found is None:
                    stale.add(f"{path.relative_to(ROOT)}: {reference}")
                break
    assert sorted(stale) == []


def _messages_in(package: Path) -> str:
    """Every string literal of the package's modules, an f-string's fields as ``{}``, one per line."""
    import ast

    texts = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return "\n".join(" ".join(text.split()) for text in texts)


def test_troubleshooting_quotes_what_the_code_says() -> None:
    """Each message docs/troubleshooting.md quotes (in double backquotes) is in a string of the
    package, so a reworded error cannot leave the page behind."""
    quoted = [
        " ".join(q.split())
        for q in re.findall(r"``(.+?)``", (ROOT / "docs" / "troubleshooting.md").read_text(), re.S)
    ]
    assert len(quoted) >= 10
    messages = _messages_in(ROOT / "dynamo_nb")
    assert [q for q in quoted if q not in messages] == []


def test_each_glossary_term_is_named_by_the_notebook_it_points_to() -> None:
    """docs/glossary.md: every term (before any parenthesis; ``_`` read as a space) appears in the
    notebook its row links."""
    import json

    rows = re.findall(r"^\| ([^|]+) \| [^|]+ \| \[\d\d\]\(\.\./notebooks/([^)]+)\) \|$",
                      (ROOT / "docs" / "glossary.md").read_text(), re.M)  # fmt: skip
    assert len(rows) >= 20
    missing = []
    for terms, notebook in rows:
        cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
        text = " ".join("".join(cell["source"]) for cell in cells).lower().replace("_", " ")
        for term in terms.split(","):
            name = re.sub(r"\s*\(.*\)", "", term).strip().strip("`").lower().replace("_", " ")
            if name not in text:
                missing.append(f"{name} ({notebook})")
    assert missing == []
