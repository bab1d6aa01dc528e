"""The package's types are checked (mypy, in CI: `python3 -m mypy`, configured in pyproject.toml);
what mypy is told to skip says why, so a reader can judge each exception."""

from __future__ import annotations

import re

from helpers import ROOT

IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def unjustified(source: str) -> list[str]:
    """The lines of ``source`` with a ``# type: ignore`` that names no error code or gives no
    reason in a comment after it (``# type: ignore[arg-type]  # why``)."""
    found = []
    for line in source.splitlines():
        match = IGNORE.search(line)
        if match and (not match["codes"] or not re.match(r"\s+#\s*\S", match["rest"])):
            found.append(line.strip())
    return found


def test_every_type_ignore_names_its_error_and_says_why() -> None:
    bad = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "dynamo_nb").rglob("*.py"))
        if (lines := unjustified(path.read_text()))
    }
    assert not bad, bad


def test_an_ignore_without_a_code_or_a_reason_is_found() -> None:
    assert unjustified("x = f()  # type: ignore") == ["x = f()  # type: ignore"]
    assert unjustified("x = f()  # type: ignore[arg-type]") == ["x = f()  # type: ignore[arg-type]"]
    assert unjustified("x = f()  # type: ignore[arg-type]  # f takes any int here") == []


def test_mypy_is_configured_over_the_package_and_run_by_ci() -> None:
    config = (ROOT / "pyproject.toml").read_text()
    assert "[tool.mypy]\n" in config and 'files = ["dynamo_nb"]' in config
    assert "mypy" in re.search(r"^dev = \[(.*?)^\]", config, re.S | re.M).group(1)
    assert re.search(r"^python3 -m mypy", (ROOT / ".ci" / "run").read_text(), re.M)


def test_every_function_is_typed_and_the_types_ship() -> None:
    """mypy refuses a function of the package without its parameter and return types, and the
    package says it is typed (PEP 561: ``py.typed`` beside its modules, in the wheel with them),
    so a user's type checker reads them too."""
    config = (ROOT / "pyproject.toml").read_text()
    mypy = config.split("\n[tool.mypy]\n", 1)[1].split("\n[", 1)[0]
    assert "disallow_untyped_defs = true" in mypy and "disallow_incomplete_defs = true" in mypy
    assert (ROOT / "dynamo_nb" / "py.typed").is_file()
