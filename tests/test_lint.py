"""The tree's lint and layout hold: ruff's checks and its formatter over the package, the
components, the benchmarks, the tests and the notebooks (their settings in pyproject.toml), so
that what a change breaks in them fails here and not in a reader's editor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.processes
def test_ruff_finds_nothing_to_fix() -> None:
    found = ruff("check", "--output-format", "concise")
    assert found.returncode == 0, f"ruff check . found:\n{found.stdout}{found.stderr}"


@pytest.mark.processes
def test_the_code_is_laid_out_as_ruff_lays_it_out() -> None:
    found = ruff("format", "--check")
    assert found.returncode == 0, f"ruff format would change these (run it):\n{found.stdout}{found.stderr}"
