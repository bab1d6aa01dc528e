"""A strict checker for the Mermaid diagrams the docs and notebooks draw: flowcharts and sequence
diagrams, by the rules of Mermaid's own grammar (its flowchart and sequence lexers), so a diagram
that would show a parse error in JupyterLab fails a test in seconds instead.

It accepts a subset of Mermaid — what a reader's diagram needs — and rejects anything outside it
with the rule broken, so it may be stricter than Mermaid but never lets through what Mermaid
refuses: a node named by a keyword (``graph[running graph]``), brackets or quotes inside
unquoted text, ``;`` inside a message (Mermaid ends the statement there), an unclosed shape,
an unknown arrow, a block without its ``end``. The browser test renders a sample of good and bad
diagrams in JupyterLab and checks that this checker agrees with Mermaid on each.

Example:
    >>> mermaid_problems("flowchart LR\\n  plan -->|replicas| graph[running graph]\\n")
    ["line 2: a node named 'graph', a Mermaid keyword (rename it)"]
"""

from __future__ import annotations

import re

FLOW_KEYWORDS = frozenset(
    "graph flowchart subgraph end style class classDef click linkStyle direction default call href".split()
)
SEQUENCE_BLOCKS = frozenset("loop alt opt par critical break rect".split())
SEQUENCE_KEYWORDS = SEQUENCE_BLOCKS | frozenset(
    "end else and option participant actor note activate deactivate autonumber".split()
)
DIRECTIONS = ("LR", "RL", "TB", "TD", "BT")
# opening bracket of a node's shape → its closing one, longest first (Mermaid's shape tokens)
SHAPES = (
    ("(((", ")))"), ("([", "])"), ("[[", "]]"), ("[(", ")]"), ("((", "))"), ("{{", "}}"),
    ("[/", "/]"), ("[\\", "\\]"), ("[", "]"), ("(", ")"), ("{", "}"), (">", "]"),
)  # fmt: skip
NODE_ID = re.compile(r"[A-Za-z0-9_]+")
SUBGRAPH = re.compile(r'subgraph\s+(?:[A-Za-z0-9_]+(?:\s*\[(?:"[^"]*"|[^\[\]"()]*)\])?|"[^"]*")')
# -->, --->, ---, ==>, ===, -.->, -.-, with an optional start arrow and circle/cross ends
PLAIN_LINK = re.compile(r"<?(?:-{2,}[->ox]|={2,}[=>ox]|-\.+-[>ox]?)")
TEXT_LINKS = (  # -- text -->, == text ==>, -. text .->
    re.compile(r"<?--\s+(?P<text>\"[^\"]*\"|[^\"\-|][^\"|]*?)\s+-{2,}[->ox]"),
    re.compile(r"<?==\s+(?P<text>\"[^\"]*\"|[^\"=|][^\"|]*?)\s+={2,}[=>ox]"),
    re.compile(r"<?-\.\s+(?P<text>\"[^\"]*\"|[^\"\-.|][^\"|]*?)\s+\.-[>ox]?"),
)
UNQUOTED_FORBIDDEN = set('[](){}"|;')
MESSAGE = re.compile(
    r"(?P<source>[A-Za-z0-9_]+)\s*(?:-->>|->>|-->|->|--x|-x|--\)|-\))\s*[+-]?"
    r"(?P<target>[A-Za-z0-9_]+)\s*:(?P<text>.*)$"
)


def mermaid_problems(block: str) -> list[str]:
    """What Mermaid would refuse in ``block`` (a diagram's source, without its fences): ``[]``
    when it renders. Flowcharts and sequence diagrams only; another kind is itself a problem."""
    lines = block.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ["an empty diagram"]
    head = lines[0].split()
    body = [(number, line.strip()) for number, line in enumerate(lines[1:], start=2)]
    body = [(number, line) for number, line in body if line and not line.startswith("%%")]
    if head[0] in ("flowchart", "graph"):
        if len(head) != 2 or head[1] not in DIRECTIONS:
            return [f"line 1: {lines[0].strip()!r}: a flowchart names one direction of {DIRECTIONS}"]
        return _flowchart(body)
    if head == ["sequenceDiagram"]:
        return _sequence(body)
    return [f"line 1: {lines[0].strip()!r}: not a flowchart or sequenceDiagram (the kinds this checks)"]


def _unquoted_problem(text: str, where: str) -> str | None:
    bad = sorted(UNQUOTED_FORBIDDEN & set(text))
    if bad:
        return f'{where} {text!r} has {" ".join(bad)} outside quotes (put the text in "…")'
    return None


def _text(line: str, at: int, closing: str) -> tuple[int, str | None]:
    """The shape text starting at ``at`` up to ``closing``: (position after it, problem)."""
    if line.startswith('"', at):
        end = line.find('"', at + 1)
        if end < 0:
            return len(line), f"an unclosed quote at column {at + 1}"
        if not line.startswith(closing, end + 1):
            return len(line), f"text in quotes must be followed by {closing!r} at column {end + 2}"
        return end + 1 + len(closing), None
    end = line.find(closing, at)
    if end < 0:
        return len(line), f"a shape opened at column {at} is never closed with {closing!r}"
    return end + len(closing), _unquoted_problem(line[at:end], "the text")


def _node(line: str, at: int) -> tuple[int, str | None]:
    match = NODE_ID.match(line, at)
    if not match:
        return at, f"expected a node at column {at + 1}: {line[at : at + 30]!r}"
    if match.group() in FLOW_KEYWORDS:
        return at, f"a node named {match.group()!r}, a Mermaid keyword (rename it)"
    at = match.end()
    for opening, closing in SHAPES:
        if line.startswith(opening, at):
            return _text(line, at + len(opening), closing)
    return at, None


def _link(line: str, at: int) -> tuple[int, str | None]:
    for pattern in TEXT_LINKS:
        match = pattern.match(line, at)
        if match:
            text = match.group("text")
            return match.end(), None if text.startswith('"') else _unquoted_problem(text, "the link text")
    match = PLAIN_LINK.match(line, at)
    if not match:
        return at, f"expected an arrow at column {at + 1}: {line[at : at + 30]!r}"
    at = match.end()
    label = re.match(r"\s*\|(\"[^\"]*\"|[^|]*)\|", line[at:])
    if label:
        text = label.group(1)
        problem = None if text.startswith('"') else _unquoted_problem(text, "the label")
        return at + label.end(), problem
    return at, None


def _chain(line: str) -> str | None:
    """``a[x] & b --> c -.->|y| d``: node groups joined by links."""
    at, expect_node = 0, True
    while True:
        at += len(line[at:]) - len(line[at:].lstrip())
        if at >= len(line):
            return None if not expect_node else "a link with no node after it"
        if expect_node:
            at, problem = _node(line, at)
            expect_node = False
        elif line.startswith("&", at):
            at, expect_node, problem = at + 1, True, None
        else:
            at, problem = _link(line, at)
            expect_node = True
        if problem:
            return problem


def _flowchart(body: list[tuple[int, str]]) -> list[str]:
    problems, depth = [], 0
    for number, line in body:
        for statement in (part.strip() for part in line.split(";")):
            word = statement.split(maxsplit=1)[0] if statement else ""
            if not statement:
                continue
            if word in ("style", "classDef", "class", "linkStyle", "click"):
                problems.append(
                    f"line {number}: {word!r} lines are outside what this checker knows (extend it)"
                )
            elif word == "subgraph":
                depth += 1
                if SUBGRAPH.fullmatch(statement) is None or statement.split()[1] in FLOW_KEYWORDS:
                    problems.append(
                        f'line {number}: {statement!r}: subgraph NAME, subgraph NAME[text] or subgraph "text"'
                    )
            elif word == "end":
                depth -= 1
                if depth < 0:
                    problems.append(f"line {number}: an end with no subgraph open")
                    depth = 0
            elif word == "direction":
                if statement.split()[1:] not in ([d] for d in DIRECTIONS):
                    problems.append(f"line {number}: {statement!r}: direction takes one of {DIRECTIONS}")
            else:
                problem = _chain(statement)
                if problem:
                    problems.append(f"line {number}: {problem}")
    return problems + (["a subgraph without its end"] if depth else [])


def _sequence(body: list[tuple[int, str]]) -> list[str]:
    problems: list[str] = []
    blocks: list[str] = []
    for number, line in body:
        word = line.split(maxsplit=1)[0]
        if ";" in line:
            problems.append(f"line {number}: ';' ends a statement in a sequence diagram (reword it)")
        elif word in ("participant", "actor"):
            match = re.fullmatch(r"\w+\s+([A-Za-z0-9_]+)(\s+as\s+.+)?", line)
            if not match or match.group(1) in SEQUENCE_KEYWORDS:
                problems.append(f"line {number}: {line!r}: participant NAME [as text], a plain name")
        elif word == "Note":
            if not re.fullmatch(r"Note\s+(left of|right of|over)\s+\w+(\s*,\s*\w+)?\s*:.*", line):
                problems.append(f"line {number}: {line!r}: Note over|left of|right of A[,B]: text")
        elif word in SEQUENCE_BLOCKS:
            blocks.append(word)
        elif word in ("else", "and", "option"):
            parent = {"else": "alt", "and": "par", "option": "critical"}[word]
            if not blocks or blocks[-1] != parent:
                problems.append(f"line {number}: {word!r} outside a {parent} block")
        elif word == "end":
            if not blocks:
                problems.append(f"line {number}: an end with no block open")
            else:
                blocks.pop()
        elif word in ("activate", "deactivate", "autonumber"):
            continue
        else:
            match = MESSAGE.fullmatch(line)
            if not match:
                problems.append(f"line {number}: {line!r}: not a message (A->>B: text) or a statement")
            elif {match.group("source"), match.group("target")} & SEQUENCE_KEYWORDS:
                problems.append(f"line {number}: a participant named by a keyword")
    return problems + [f"a {block} block without its end" for block in blocks]


# Diagrams with what Mermaid itself does with each (True: it draws it), for the browser test that
# checks this checker agrees with Mermaid in JupyterLab, and for the fast test of the checker.
SAMPLES: dict[str, tuple[bool, str]] = {
    "shapes": (True, 'flowchart LR\n  a["quoted (parens) ok"] --> b[(store)] --> c{{"hex"}}\n  c -.-> d((round))\n'),
    "text links": (True, 'flowchart TB\n  a -- "x" --> b\n  a -. note .-> c\n  b & c ==> d\n'),
    "subgraph": (True, "flowchart LR\n  subgraph one\n    a --> b\n  end\n  b --> c\n"),
    "sequence": (True, "sequenceDiagram\n  participant A as a client\n  par at once\n    A->>B: go\n  and\n"
                       "    A->>C: go\n  end\n  Note over A,B: done\n  B-->>A: tokens\n"),
    "node named graph": (False, "flowchart LR\n  plan -->|replicas| graph[running graph]\n"),
    "node named end": (False, "flowchart LR\n  a --> end\n"),
    "parens in square text": (False, "flowchart LR\n  a[text (paren)] --> b\n"),
    "unclosed quote": (False, 'flowchart LR\n  a --> b["unclosed]\n'),
    "unknown arrow": (False, "flowchart LR\n  a ~~> b\n"),
    "block without end": (False, "sequenceDiagram\n  par x\n    A->>B: hi\n"),
    "message without colon": (False, "sequenceDiagram\n  A->>B hi\n"),
    "parens in an unquoted label": (False, "flowchart LR\n  a -->|label (x)| b\n"),
    "semicolon in a message": (False, "sequenceDiagram\n  A->>B: one; two\n"),
}  # fmt: skip
