"""A notebook's markdown says what to look for; a measured result goes in a `dynamo_nb.claim`.

Prose is written once and numbers are re-measured on every run, so a sentence in markdown that
states a measured comparison ("the hf engine answers sooner", "the fast path saves the round
trip", "one or two engines per prompt") can be contradicted by the very outputs under it. The
rule below finds such sentences: a comparative or trend word beside a measured quantity (in
the sentence, or earlier in its paragraph when the sentence refers back to it). What it finds
moves into a claim, is rewritten as what to look for, or, for definitions and facts of design,
is allowed below with the reason.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

COMPARATIVE = re.compile(
    r"\b(faster|slower|sooner|later|lower|higher|more|fewer|less|least|most|lead|wins?|beats?|saves?|"
    r"cuts?|drops?|rises?|grows?|falls?|doubles?|halves|better|worse|than|outperforms?|pulls? ahead|"
    r"falls? behind|followed|tracks?|keeps? up|exceeds?|misses|meets?|slowest|fastest|"
    r"close|closer|leads?|flattens?|(?<!\*\*)(?<!KV )overlaps?(?!\*\*))\b"
    r"|\bkeeps? [\w ]{1,40}? on (one|two|a|the same)\b|\babout \d+ of( the)? \d+\b"
    r"|\b(over|under|above|below|within)\s+(\d|half|a tenth|a third|a quarter)"
    r"|×|\b\d+(\.\d+)?x\b|\d\s*→\s*\d|\b(one|two|three|four|five) or (two|three|four|five)\b",
    re.IGNORECASE,
)
"""Words that compare or say which way a number went (and number ranges, ratios, sequences)."""

MEASURED_ON_ITS_OWN = re.compile(
    r"\bkeeps? [\w ]{1,40}? on (one|a single|the same) (engine|worker)s?\b|\babout \d+ of( the)? \d+\b"
    r"|\b(pays?|paid) off\b|\bin every (run|round)\b|\b(mostly|largely|almost all|nearly all)\b"
    r"|(~|\babout |\baround |\broughly )\d+(\.\d+)?\s*(ms|s|%|µs)\b",
    re.IGNORECASE,
)
"""Phrases that state a measured result by themselves: where requests stayed, a count out of a
total, whether something paid off, that something held in every run, a share in a word ("mostly"),
a figure given roughly ("~40 ms")."""

STRONG = re.compile(
    r"\b(faster|slower|sooner|leads?|wins?|beats?|saves?|outperforms?|pulls? ahead|close|closer)\b", re.I
)
"""Comparisons that carry a measurement even when the quantity is named a sentence earlier."""

LOOK_FOR = re.compile(r"\b(whether|look (at|for)|watch (for|how|whether)|see (if|whether|how))\b", re.I)
"""A sentence that tells the reader what to look for states no result."""

MEASURED = re.compile(
    r"\b(TTFT|ITL|latency|latencies|throughput|tok/s|tokens/s|req/s|requests/s|p50|p90|p99|median|mean|"
    r"hit rate|hits|overlap|replicas?|goodput|attainment|SLO|concurrency|round trip|engines|workers|cached|"
    r"reuse|per second|gaps?|ratios?|blocks|waits?|waited|waiting)\b|\d\s*(ms|s|%)\b",
    re.IGNORECASE,
)
"""What a notebook measures: latencies, rates, shares, counts of engines and workers."""

ALLOWED = {
    (
        "06_kv_aware_routing",
        "is the prompt blocks it would compute",
    ): "the router's cost defined (the code's words)",
    (
        "14_tune_the_router",
        "is the prompt blocks it would compute",
    ): "the router's cost defined (the code's words)",
    ("05_disaggregated_serving", "one more round trip"): "the fallback path's extra hop is its design",
    ("05_disaggregated_serving", "adds two more"): "a count of the workers the notebook starts",
    ("13_on_nvidia_dynamo", "Below 1 in the TTFT column"): "how to read a ratio column, not a result",
    (
        "04_measuring_ttft",
        "a level can come out slower",
    ): "a caution about noise on a shared machine, no result",
    ("09_capacity_planning", "A request *meets* it or not"): "what an SLO is",
    (
        "09_capacity_planning",
        "can come out a little higher than",
    ): "what the two rates' windows mean, not a result",
    ("09_capacity_planning", '"p90 TTFT ≤ 500 ms" means'): "what an SLO is",
    ("09_capacity_planning", "the less loaded of two instances"): "what the least-loaded router does",
    ("09_capacity_planning", "the queue grows for as long as the level runs"): "what saturated means",
    ("09_capacity_planning", 'answers "what rate can two workers serve'): "what a function answers",
    ("09_capacity_planning", "It draws only the rates"): "what the chart draws",
    ("09_capacity_planning", "no other drawn rate beats on both axes"): "what the Pareto front is",
    ("09_capacity_planning", "the fewest engines can come out one higher"): "a caution about a busy machine",
    ("09_capacity_planning", "the smallest fleet whose requests meet the SLO"): "what sizing is (the recap)",
    (
        "09_capacity_planning",
        "a rate whose answers fall behind its arrivals",
    ): "what saturated means (the recap)",
    ("05_disaggregated_serving", "does fewer rounds"): "what the export's smoke check does",
    ("13_on_nvidia_dynamo", "measures more levels"): "what a benchmark script covers",
    ("06_kv_aware_routing", "a higher weight favours cache hits"): "what the weight means",
    ("05_disaggregated_serving", "The CDF below shows the slowest 5 %"): "what the chart shows",
    ("07_serving_with_vllm", "On a host with 4 cores or fewer"): "how the vLLM worker is run, by design",
    ("06_kv_aware_routing", "cannot see load, though"): "what such a policy cannot do, by design",
    (
        "06_kv_aware_routing",
        "This one keeps each system prompt on one engine",
    ): "what the policy does, by design",
    ("11_why_that_worker", "above 1 favours the caches more"): "what the knob does, by design",
    ("09_capacity_planning", "flat while the engines keep up"): "what a queue looks like in TTFT",
    ("09_capacity_planning", "more tokens/s at a lower p90 TTFT"): "what the Pareto front is",
    ("09_capacity_planning", "more tokens/s in total at a higher speed per user"): "what the Pareto front is",
    (
        "12_plan_from_a_trace",
        "scaled up at once when the rate needs more workers",
    ): "what the autoscaler does",
    ("06_kv_aware_routing", "sends fewer requests and checks"): "what the smoke check does",
    ("12_plan_from_a_trace", "ask a planner for the fewest workers that meet"): "what the notebook teaches",
    ("12_plan_from_a_trace", "answers the fewest that meet the SLO"): "what plan() answers",
    (
        "12_plan_from_a_trace",
        "answers the fewest whose p90 TTFT and p90 ITL meet the SLO",
    ): "what plan() answers",
    (
        "12_plan_from_a_trace",
        "its target is the rate one worker serves within the SLO",
    ): "what throughput mode does",
    (
        "12_plan_from_a_trace",
        "the planner's answer meets the SLO where one fewer worker does not",
    ): "what the smoke check checks",
    ("11_why_that_worker", "that the predictions were mostly exact"): "what the smoke check checks",
    (
        "13_on_nvidia_dynamo",
        "a kept-alive connection added ~40 ms",
    ): "a figure cited from docs/benchmarks.md's recorded runs, said to be theirs",
}
"""Sentences the rule finds that state no measured result: (notebook, phrase) → why."""


def measured_statements(markdown: str) -> list[str]:
    """The sentences of ``markdown`` that state a measured comparison (see the module docstring).

    Example:
        >>> measured_statements("The hf engine's TTFT is lower. Start two workers.")
        ["The hf engine's TTFT is lower."]
    """
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", "CODE", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's words, not its address
    found = []
    for paragraph in re.split(r"\n\s*\n|\n\s*[-*>]\s+|\n#+\s", text):
        before = ""
        for whole in re.split(r"(?<=[.!?])\s+", paragraph.strip()):
            # a clause after a colon or a semicolon can say something of its own ("Look at X: Y is
            # lower"); after a look-for clause only a strong comparison or a count counts
            looking = False
            for sentence in re.split(r"(?<=[:;])\s+", whole):
                refers_back = re.search(r"\b(it|this|that|them|they|the ones)\b", sentence) or STRONG.search(
                    sentence
                )
                looking = looking or bool(LOOK_FOR.search(sentence))
                if MEASURED_ON_ITS_OWN.search(sentence) and not LOOK_FOR.search(sentence):
                    found.append(sentence)
                elif (
                    (not looking or STRONG.search(sentence))
                    and not LOOK_FOR.search(sentence)
                    and COMPARATIVE.search(sentence)
                    and (MEASURED.search(sentence) or (refers_back and MEASURED.search(before)))
                ):
                    found.append(sentence)
                before += " " + sentence
    return found


def unallowed(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sentences = [
        sentence
        for cell in cells
        if cell["cell_type"] == "markdown"
        for sentence in measured_statements("".join(cell["source"]))
    ]
    return [s for s in sentences if not any(nb == notebook.stem and phrase in s for nb, phrase in ALLOWED)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_markdown_states_no_measured_result(notebook: Path) -> None:
    found = unallowed(notebook)
    assert not found, (
        f"{notebook.name}: these sentences state measured results in markdown; move each into a "
        "dynamo_nb.claim in a code cell (the markdown says what to look for), or allow it in "
        f"tests/test_notebook_claims.py with the reason: {found}"
    )


def test_every_allowed_sentence_is_still_there() -> None:
    stale = []
    for stem, phrase in ALLOWED:
        cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]
        markdown = " ".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
        if phrase not in markdown:
            stale.append((stem, phrase))
    assert not stale, f"allowed phrases no notebook has any more (drop them): {stale}"


CONTRADICTED = [  # sentences found in the notebooks' stored runs that their own numbers contradicted
    "One request at a time the `hf` engine answers sooner (less machinery per token); with more "
    "requests at once vLLM pulls ahead and its lead grows with concurrency.",
    "The fallback path pays one more round trip before decode can start: the frontend waits for the "
    "prefill's `disaggregated_params` to learn the room. On the fast path the decode request leaves "
    "with the prefill and saves it.",
    "The gap is small here: the KV router keeps each system prompt on one or two engines, and a pool holds about 5.",
    "The Pareto chart shows throughput against p90 TTFT. Points on the line are the ones no other rate beats on both axes.",
    "The autoscaler followed the load: replicas went 1 → 3 → 1.",
    "So the answer is three workers, never one or two engines.",
    "The median gap between tokens is about the same either way; the slowest gaps are not.",
    "Least-loaded sends it only what the fast one cannot take, so more requests finish per second.",
    # missed by the rule before it knew these words (a reader's pass over the stored runs found them)
    "One request at a time the two engines' throughput is close, and which one leads changes from run to run.",
    "Then look where throughput flattens as concurrency grows.",
    "On one host the two disaggregated paths overlap, as the claims below state.",
    "The KV router can keep each prompt on one engine.",
    "About 8 of the 24 prompts went back to the engine that held them.",
    "Did retuning pay off live?",
    "vLLM's 0.57 is a lead over the hf engine's TTFT.",
    "The holder wins here because of a prefill it would mostly skip.",
    "With priorities the interactive requests wait under half as long as the batch.",
    "Dynamo's HTTP server leaves Nagle's algorithm on, which adds ~40 ms to a small answer.",
    "The hf engine's lead at c = 16 held in every run.",
]


@pytest.mark.parametrize("markdown", CONTRADICTED)
def test_the_rule_finds_the_sentences_that_were_contradicted(markdown: str) -> None:
    assert measured_statements(markdown), markdown


@pytest.mark.parametrize(
    "markdown",
    [
        "Start two prefill workers and a decode worker over a local etcd.",
        "The cell below prints TTFT p50 per path: look at whether the fast one is lower.",
        "`bench.summary` gives p50/p90/p99 of TTFT per concurrency (in ms).",
        "Workers and frontends run as processes over etcd, or in static mode over NATS.",
        "A frontend that routes by KV overlap with the workers' KV events over NATS.",
        "Look at whether the two paths overlap on this machine.",
    ],
)
def test_the_rule_leaves_instructions_and_definitions_alone(markdown: str) -> None:
    assert not measured_statements(markdown), markdown


UPSTREAM = re.compile(
    r"\]\((https://(docs\.nvidia\.com/dynamo/|github\.com/ai-dynamo/|docs\.vllm\.ai/|docs\.sglang\.io/)[^)\s]+)\)"
)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_each_notebook_links_the_upstream_page_it_mirrors(notebook: Path) -> None:
    """A reader who knows Dynamo, vLLM or SGLang finds their page for what the notebook shows,
    in its recap (a link on Dynamo's docs names the release the kit is measured against, 1.6, or
    1.7 for a feature the kit takes from that release)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    recap = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## Recap"))
    links = [match.group(1) for match in UPSTREAM.finditer(recap)]
    assert links, (
        f"{notebook.name}: its recap has no **Upstream:** link to Dynamo's, vLLM's or SGLang's pages"
    )
    assert all(
        "/dynamo/v1.6.0/" in link or "/dynamo/v1.7.0/" in link for link in links if "docs.nvidia.com" in link
    ), links


SIMULATES = re.compile(r"(?<![\w.])(replay|plan|retune)\(|\bRetuner\(")
"""A cell that computes figures by replay: `replay`, `planner.plan`, `planner.retune`, the `Retuner`."""

WITH_ERROR = re.compile(r"\berror=|\bfidelity\(|\bmodel_error\(")
"""What shows a replayed figure's error: the measured error passed on (``error=``), or the replay
set beside a live run (`replay.fidelity`)."""

SIMULATED_ALLOWED = {
    ("14_tune_the_router", "# retuned():"): "the loop's margins are drawn against its threshold; the "
    "replay's error is measured and shown in the retune above it, and a loop told the error would keep "
    "a policy this shared machine's load can put within it",
}
"""Cells that replay without showing the error: (notebook, the cell's first line) → why."""


def simulated_without_error(notebook: Path) -> list[str]:
    """The first lines of ``notebook``'s code cells that compute figures by replay and show
    nothing of its error (see `SIMULATES`, `WITH_ERROR`).

    Example:
        >>> cells = [{"cell_type": "code", "source": ["answer = plan(trace, SLO)\\n"]}]
        >>> import tempfile; path = Path(tempfile.mkdtemp()) / "99_x.ipynb"
        >>> _ = path.write_text(json.dumps({"cells": cells}))
        >>> simulated_without_error(path)
        ['answer = plan(trace, SLO)']
    """
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and SIMULATES.search(source) and not WITH_ERROR.search(source):
            first = source.splitlines()[0]
            if not any(nb == notebook.stem and first.startswith(start) for nb, start in SIMULATED_ALLOWED):
                found.append(first)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_replayed_figure_shows_its_error(notebook: Path) -> None:
    """A chart or table a notebook computes by replay is a prediction: the cell that computes it
    passes the timing model's measured error on (``error=``, drawn as a band) or sets the replay
    beside the live run (``fidelity``), so no simulated figure is shown without its error."""
    found = simulated_without_error(notebook)
    assert not found, (
        f"{notebook.name}: these cells compute figures by replay and show none of its error: {found}; measure "
        "it (replay.fidelity against a live run, replay.model_error) and pass error= to plan/retune, or allow "
        "the cell in SIMULATED_ALLOWED with the reason"
    )


def test_a_replayed_figure_without_its_error_is_found(tmp_path: Path) -> None:
    """The rule fails a notebook that drops the error (the check of the check)."""
    notebook = json.loads((ROOT / "notebooks" / "12_plan_from_a_trace.ipynb").read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        cell["source"] = [
            line.replace(", error=error", "").replace("error=error,", "") for line in cell["source"]
        ]
    dropped = tmp_path / "12_plan_from_a_trace.ipynb"
    dropped.write_text(json.dumps(notebook))
    assert len(simulated_without_error(dropped)) == 1  # the Try-it plan; the others set fidelity beside


CONTROL_CALLS = frozenset({"spread", "spread_chart", "median_interval"})
CONTROL_COLUMNS = frozenset({"repeat", "round"})


def _shows_a_control(tree: ast.AST) -> bool:
    """Whether a cell's code (not its comments, not a claim's sentence) shows a comparison's
    control: runs tagged with their round (a ``repeat=`` keyword, or the ``"repeat"`` or
    ``"round"`` column used), so each side ran in turns and the machine's drift hit both; a paired
    interval (`bench.median_interval` of the differences between the two sides' requests of a
    round); the spread over rounds (`bench.spread`, `bench.spread_chart`)."""
    sentences = {id(node.args[0]) for node in ast.walk(tree) if _is_claim(node) and node.args}
    for node in ast.walk(tree):
        if _called(node) in CONTROL_CALLS:
            return True
        if isinstance(node, ast.keyword) and node.arg in CONTROL_COLUMNS:
            return True
        if isinstance(node, ast.Constant) and node.value in CONTROL_COLUMNS and id(node) not in sentences:
            return True
    return False


COMPARISON_ALLOWED = {
    ("05_disaggregated_serving", "the fast path's decode request waits less"): "a wait the frontend "
    "measures per request, five a path; the fallback's is the prefill's whole first item, several times "
    "the fast path's",
    ("05_disaggregated_serving", "on one host that wait is under a tenth of a TTFT"): "a bound against "
    "a tenth of the TTFT, not two runs",
    ("05_disaggregated_serving", "across hosts the fast path's TTFT lead grows"): "read from "
    "benchmarks/disagg_hosts.py's recorded result, which measures each delay's paths interleaved",
    ("05_disaggregated_serving", "the median gap between tokens is the same within 25 %"): "a bound "
    "(within 25 %), the two fleets served by the same simulated engines",
    ("05_disaggregated_serving", "the slowest gaps (p99) are under 0.6"): "simulated engines whose step "
    "time is a function of the batch: the long prefills' stall is in the model, not the machine's noise",
    ("06_kv_aware_routing", "keeps each on fewer than 2 engines"): "where requests went is the "
    "router's decision, counted, not a time the machine's noise moves",
    ("09_capacity_planning", "the sweep crosses what two workers answer"): "a threshold (the SLO) "
    "across a sweep, not two runs",
    ("09_capacity_planning", "one or two engines leave too many"): "a threshold (the SLO), not two runs",
    ("11_why_that_worker", "the router's prediction of the cached prefix was exact"): "the router's "
    "prediction against the engine's count for the same request",
    ("11_why_that_worker", "the engine holding most of the prompt lost"): "the router's own decision "
    "record of one request, costs it computed",
    ("11_why_that_worker", "the engines reused what the router predicted"): "prediction and count "
    "for the same requests",
    ("11_why_that_worker", "what the engines evicted stays under a tenth"): "a bound, not two runs",
    ("12_plan_from_a_trace", "the replay reuses the live run's prefixes"): "the replay of the live "
    "run's own trace set beside it (the same requests)",
    ("12_plan_from_a_trace", "each model's TTFT p50 lands within 30 %"): "the replay of the live "
    "run's own trace set beside it (the same requests)",
    ("12_plan_from_a_trace", "workers are the fewest whose replay meets the SLO"): "a deterministic "
    "replay (same trace, same seed) against a threshold",
    ("12_plan_from_a_trace", "workers meet it too, at a higher cost"): "a deterministic replay of the "
    "same trace",
    ("12_plan_from_a_trace", "within the measured error"): "a deterministic replay, banded by its "
    "measured error",
    ("12_plan_from_a_trace", "replicas went 1"): "the autoscaler's own decisions, counted",
    ("14_tune_the_router", "the replay orders the two policies"): "a deterministic replay of the same "
    "requests under each policy (same trace, same seed)",
    ("14_tune_the_router", "the winner counts cached prompts"): "a deterministic replay of the same "
    "trace per policy, banded by its measured error",
}
"""Comparisons in claims whose control is not a repeat or a paired interval: (notebook, phrase) → why
the two sides are alike, or why it is no comparison of two runs (a threshold, a count)."""


def _called(node: ast.AST) -> str | None:
    """The name a call calls (``claim`` for ``claim(...)`` and ``dynamo_nb.claim(...)``), else None."""
    if not isinstance(node, ast.Call):
        return None
    return getattr(node.func, "id", None) or getattr(node.func, "attr", None)


def _is_claim(node: ast.AST) -> bool:
    return _called(node) == "claim"


def _parse(source: str) -> ast.AST:
    """A code cell's source as a tree (top-level ``await`` allowed, magics and shell lines left out)."""
    lines = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    return compile(lines, "cell", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _claim_sentences(tree: ast.AST) -> list[str]:
    """The sentence of every ``claim(...)`` call in a cell's tree (the constant parts of an
    f-string); a sentence the rule cannot read (a variable, a sum) comes back as a finding of its
    own, so no claim escapes it."""
    sentences = []
    for node in ast.walk(tree):
        if not (_is_claim(node) and node.args):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            sentences.append(first.value)
        elif isinstance(first, ast.JoinedStr):
            sentences.append("".join(v.value for v in first.values if isinstance(v, ast.Constant)))
        else:
            sentences.append(
                f"a claim whose sentence is computed ({ast.unparse(first)}): write it as a string"
            )
    return sentences


def comparisons_without_control(notebook: Path, *, allowed: bool = True) -> list[str]:
    """The claims of ``notebook`` that compare measured quantities in a cell that shows no control
    (see `_shows_a_control`), less those allowed with a reason in `COMPARISON_ALLOWED` (unless
    ``allowed`` is false).

    Example:
        >>> source = 'claim("with priorities the interactive requests wait under half as long", ok)'
        >>> import tempfile; path = Path(tempfile.mkdtemp()) / "99_x.ipynb"
        >>> _ = path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [source]}]}))
        >>> comparisons_without_control(path)
        ['with priorities the interactive requests wait under half as long']
    """
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        tree = _parse("".join(cell["source"]))
        if _shows_a_control(tree):
            continue
        for sentence in _claim_sentences(tree):
            computed = sentence.startswith("a claim whose sentence is computed")
            if not computed and not (COMPARATIVE.search(sentence) and MEASURED.search(sentence)):
                continue
            if allowed and any(
                nb == notebook.stem and phrase in sentence for nb, phrase in COMPARISON_ALLOWED
            ):
                continue
            found.append(sentence)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_compared_claim_has_its_control(notebook: Path) -> None:
    """A claim that compares two measured numbers rests on a control: both sides run in turns
    (rounds, a ``repeat`` column) with their spread, or paired request by request; priorities on
    against priorities off, a policy before and after on the same requests."""
    found = comparisons_without_control(notebook)
    assert not found, (
        f"{notebook.name}: these claims compare measured numbers with no control in their cell: {found}; run "
        "each side in rounds that alternate (a repeat column, bench.spread) or pair the requests "
        "(bench.median_interval of the differences), or allow the claim in COMPARISON_ALLOWED with the reason"
    )


UNCONTROLLED = [  # comparisons the notebooks once claimed with no control beside them
    "with priorities the interactive requests wait under half as long as the batch",
    "live, the applied policy routed them all, reuses more of the prompts and has the lower mean TTFT",
    "least-loaded: more requests finish per second, and the slowest finish sooner (p90 end-to-end)",
]


@pytest.mark.parametrize("sentence", UNCONTROLLED)
def test_a_comparison_without_its_control_is_found(sentence: str, tmp_path: Path) -> None:
    """The rule fails such a claim in a cell of one run (a "repeat" in a comment or in the claim's
    own words is no control), and passes it once the cell runs in rounds or pairs its requests."""
    alone = f"before, after = await served(a), await served(b)  # no repeat here\nclaim({sentence + ' (repeat)'!r}, ok)\n"
    rounds = f"runs = [(await served(p)).assign(repeat=r) for r in range(2) for p in ps]\nclaim({sentence!r}, ok)\n"
    paired = f"low, _, high = bench.median_interval(after - before)\nclaim({sentence!r}, low > 0)\n"
    computed = "claim(WORDS, ok)\n"
    cases = ((alone, [sentence + " (repeat)"]), (rounds, []), (paired, []), (computed, ["computed"]))
    for source, expected in cases:
        path = tmp_path / "99_x.ipynb"
        path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [source]}]}))
        found = comparisons_without_control(path)
        assert [("computed" if "computed" in f else f) for f in found] == expected, (source, found)


def test_every_allowed_comparison_is_still_needed() -> None:
    """Each allowance matches a claim the rule finds with the allow-list off: one whose cell has
    since gained its control, or whose sentence changed, is dropped."""
    stale = []
    for stem, phrase in COMPARISON_ALLOWED:
        found = comparisons_without_control(ROOT / "notebooks" / f"{stem}.ipynb", allowed=False)
        if not any(phrase in sentence for sentence in found):
            stale.append((stem, phrase))
    assert not stale, f"allowed comparisons the rule no longer finds (drop them): {stale}"
