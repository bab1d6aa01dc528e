"""Every Mermaid diagram in the notebooks, the README and docs/ passes the strict checker in
``mermaid_check.py`` (Mermaid's grammar rules for flowcharts and sequence diagrams), so a diagram
JupyterLab or GitHub would show as a parse error fails here in seconds; the browser test checks
that the checker agrees with Mermaid itself on its samples."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from helpers import ROOT
from mermaid_check import SAMPLES, mermaid_problems

MERMAID_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.S)


def documents() -> list[Path]:
    return (
        sorted((ROOT / "notebooks").glob("*.ipynb"))
        + sorted((ROOT / "docs").glob("*.md"))
        + [ROOT / "README.md"]
    )


def diagrams(document: Path) -> list[str]:
    if document.suffix == ".ipynb":
        texts = [cell.source for cell in nbformat.read(document, 4).cells if cell.cell_type == "markdown"]
    else:
        texts = [document.read_text()]
    return [block for text in texts for block in MERMAID_BLOCK.findall(text)]


def test_the_docs_and_notebooks_draw_diagrams() -> None:
    assert sum(len(diagrams(document)) for document in documents()) >= 10


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.name)
def test_every_diagram_follows_mermaids_grammar(document: Path) -> None:
    for block in diagrams(document):
        assert mermaid_problems(block) == [], block


@pytest.mark.parametrize("name", SAMPLES)
def test_the_checker_refuses_what_mermaid_refuses(name: str) -> None:
    drawn, block = SAMPLES[name]
    problems = mermaid_problems(block)
    assert (problems == []) is drawn, problems


def test_the_old_diagram_of_notebook_12_is_refused_naming_the_node() -> None:
    old = "flowchart LR\n  plan -->|replicas| graph[running graph]\n  autoscaler -->|scale| graph\n"
    assert mermaid_problems(old) == [
        "line 2: a node named 'graph', a Mermaid keyword (rename it)",
        "line 3: a node named 'graph', a Mermaid keyword (rename it)",
    ]


def test_subgraph_titles_and_style_lines_are_checked_too() -> None:
    """A subgraph named by a keyword or with brackets in an unquoted title is refused, and so are
    style and class lines, which this checker does not know (rather than passing them unread)."""
    good = 'flowchart LR\n  subgraph one["the (first) one"]\n    a --> b\n  end\n  subgraph "two"\n  end\n'
    assert mermaid_problems(good) == []
    for line in ("subgraph end", "subgraph one[a (b)]", 'subgraph one["unclosed]'):
        assert mermaid_problems(f"flowchart LR\n  {line}\n    a --> b\n  end\n"), line
    for line in ("style a fill:#f9f", "classDef warm fill:#f96", "class a warm"):
        assert mermaid_problems(f"flowchart LR\n  a --> b\n  {line}\n"), line
