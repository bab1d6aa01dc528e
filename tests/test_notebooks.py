"""Notebooks: plain nbconvert export runs as a program; a worker in a real kernel serves while idle."""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat
import pytest
from helpers import NEEDS_DYNAMO, NEEDS_VLLM, QUICK_EXPORTS, ROOT, collect, exported_code

from dynamo_nb import DistributedRuntime, LocalServices
from dynamo_nb.jupyter import NOTEBOOK_ONLY_TAG

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
pytestmark = pytest.mark.timeout(180)


def exports() -> list[Any]:
    """Each notebook's program, exported from the repository root and from notebooks/ (the same
    script either way) and run once. The quick ones run by default, the others in the opt-in
    ``exports`` group (.ci/run's second step); a vLLM notebook (its engines start in about a
    minute) is also in the ``vllm`` and ``long`` groups, with a longer timeout, and Dynamo's in
    the ``dynamo`` group."""
    params = []
    for notebook in NOTEBOOKS:
        if notebook.stem in NEEDS_VLLM:
            marks = [pytest.mark.timeout(600), pytest.mark.vllm, pytest.mark.long, pytest.mark.exports]
        elif notebook.stem in NEEDS_DYNAMO:  # Dynamo's stacks start in about a minute
            marks = [pytest.mark.timeout(600), pytest.mark.dynamo]
        else:
            marks = [] if notebook.stem in QUICK_EXPORTS else [pytest.mark.exports]
        params.append(pytest.param(notebook, marks=marks, id=notebook.stem))
    return params


def test_there_are_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS][:1] == ["01_runtime_basics.ipynb"]


# Visible code cells longer than this are allowed only here: the engine class is notebook 10's lesson.
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_is_shaped_for_a_reader(notebook: Path) -> None:
    """An opening of at most ~100 words (what you will learn, what you need, on the stored run's
    machine); visible code cells of
    at most 15 lines (an engine class too: split it into cells), longer ones collapsed behind a
    summary comment; a "try it" cell; a recap
    that links the next notebook (which exists) and docs/."""
    cells = nbformat.read(notebook, 4).cells
    opening = cells[0].source
    assert cells[0].cell_type == "markdown" and cells[1].cell_type == "code"
    assert "**You will learn**" in opening and "**You need**" in opening, opening
    assert "2 CPU cores (the stored run's machine)" in opening, (
        "the You need line names the stored run's machine"
    )
    track = re.search(r"^\*Track: (\w+) \((.*)\)\*$", opening, re.M)
    assert track and f"**{notebook.stem[:2]}**" in track.group(2), (
        "a track banner under the title, naming this one"
    )
    words = len(re.sub(r"^\*Track:.*$", "", opening, flags=re.M).split())  # the banner is navigation
    assert words <= 100, f"the opening has {words} words"
    for cell in cells:
        if cell.cell_type != "code":
            continue
        hidden = cell.metadata.get("jupyter", {}).get("source_hidden", False)
        first = cell.source.splitlines()[0] if cell.source else ""
        if hidden:
            assert first.startswith("#"), f"a collapsed cell shows only its first line: {first!r}"
        else:
            lines = len(cell.source.splitlines())
            assert lines <= 15, f"a visible cell of {lines} lines: {first!r}"
    assert any(c.cell_type == "code" and c.source.startswith("# Try it") for c in cells), "no try-it cell"
    recap = [c.source for c in cells if c.cell_type == "markdown" and c.source.startswith("## Recap")]
    assert recap and "**Next:**" in recap[0] and "](../docs/" in recap[0], "no recap with links"
    # a reader who follows Next has passed "as a program": the recap ends the notebook
    assert cells[-1].source == recap[0], "the recap (with its Next) is the last cell"
    assert any(c.source.startswith("## This notebook as a") for c in cells[:-1]), "no program section"
    linked = re.findall(r"\]\(([0-9]{2}_[a-z_]+\.ipynb)\)", recap[0])
    assert linked and all((notebook.parent / name).is_file() for name in linked), linked
    for doc in re.findall(r"\]\(\.\./(docs/[a-z-]+\.md)\)", recap[0]):
        assert (ROOT / doc).is_file(), doc


# JupyterLab 4 at 1400 px wide with its file browser open shows 123 characters of a code line (the
# browser test measures that no editor or collapsed-cell summary scrolls sideways); the code's own
# line length (ruff's) leaves a margin for other fonts.
CODE_WIDTH = 110
LAB_WIDTH = 123  # what the editor shows of a line: the body of a collapsed cell, expanded, fits it


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_lines_fit_the_notebook_width(notebook: Path) -> None:
    """Every line of a visible code cell, and the summary line a collapsed cell shows, fits in
    JupyterLab with the file browser open, and so does a collapsed cell's body once expanded: a
    reader never scrolls sideways to see a claim's end."""
    too_long = []
    for index, cell in enumerate(nbformat.read(notebook, 4).cells):
        if cell.cell_type != "code" or not cell.source:
            continue
        lines = cell.source.splitlines()
        collapsed = cell.metadata.get("jupyter", {}).get("source_hidden", False)
        too_long += [  # a collapsed cell's summary line as any line; its body, once expanded, in the editor
            f"cell {index}: {len(line)} characters: {line}"
            for number, line in enumerate(lines)
            if len(line) > (LAB_WIDTH if collapsed and number else CODE_WIDTH)
        ]
    assert not too_long, "\n".join(too_long)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_cells_carry_no_formatter_pragmas(notebook: Path) -> None:
    """What a reader reads is code, not tooling: the formatter leaves notebooks alone (their
    layout is by hand, their width held above), so no cell needs a ``# fmt:`` comment."""
    pragmas = [
        f"cell {index}: {line.strip()}"
        for index, cell in enumerate(nbformat.read(notebook, 4).cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if re.search(r"#\s*fmt:", line)
    ]
    assert not pragmas, "\n".join(pragmas)


def test_the_next_links_walk_the_series_and_end_at_the_readme() -> None:
    """Each recap's **Next:** names the following notebook first (01 → 02 → … → the last), and
    the last one's leads back to the README: a reader can follow the series end to end."""
    for notebook, following in zip(NOTEBOOKS, [*NOTEBOOKS[1:], None], strict=True):
        recap = next(c.source for c in nbformat.read(notebook, 4).cells if c.source.startswith("## Recap"))
        [line] = [line for line in recap.splitlines() if line.startswith("**Next:**")]
        first = re.search(r"\]\(([^)]+)\)", line)
        expected = following.name if following is not None else "../README.md"
        assert first is not None and first.group(1) == expected, f"{notebook.name}: {line}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_stored_outputs_come_from_one_run_top_to_bottom(notebook: Path) -> None:
    """Every code cell was run (its execution count and start time stored), in cell order, each
    at a time of its own: a cell split or moved by hand after the run shows as a repeated or
    out-of-order time. Re-run the notebook rather than edit its outputs."""
    runs = []
    for index, cell in enumerate(nbformat.read(notebook, 4).cells):
        if cell.cell_type == "code":
            started = cell.metadata.get("execution", {}).get("iopub.execute_input")
            assert started and cell.execution_count, f"cell {index} has no stored run"
            runs.append((started, cell.execution_count, index))
    for (before, count, index), (after, next_count, next_index) in itertools.pairwise(runs):
        assert before < after and count < next_count, (
            f"cells {index} and {next_index} were not run one after the other ({before}, {after})"
        )


def _code_cells(text: str) -> dict[str, tuple[str, str | None]]:
    """A notebook's code cells by id: (source, the time its stored run started)."""
    cells = json.loads(text)["cells"]
    return {
        cell.get("id", str(index)): (
            "".join(cell["source"]),
            cell.get("metadata", {}).get("execution", {}).get("iopub.execute_input"),
        )
        for index, cell in enumerate(cells)
        if cell["cell_type"] == "code"
    }


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.processes  # git
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stored_output_predates_its_cells_source(notebook: Path) -> None:
    """Walking the notebook's history back from the working tree: each code cell's stored run
    changed in the same version as its source last did, or in a later one. A source edited after
    its run (the output no longer the source's) fails until the notebook is re-run."""
    try:
        if _git("rev-parse", "--is-shallow-repository").strip() != "false":
            pytest.skip("the notebooks' history is not in this clone (shallow): nothing to compare")
        commits = _git("log", "--format=%H", "-n", "60", "--", str(notebook.relative_to(ROOT))).split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history here (not a clone): nothing to compare")
    relative = notebook.relative_to(ROOT).as_posix()
    versions = [notebook.read_text(encoding="utf-8")]
    versions += [_git("show", f"{commit}:{relative}") for commit in commits]
    pending = set(_code_cells(versions[0]))  # cells whose last run is not found yet
    stale = []
    for newer, older in itertools.pairwise(_code_cells(v) for v in versions):
        for cell_id in sorted(pending):
            source, started = newer.get(cell_id, ("", None))
            before = older.get(cell_id)
            if before is None or before[1] != started:  # its run changed here: resolved
                pending.discard(cell_id)
            elif before[0] != source:  # the source changed, its run did not
                stale.append(cell_id)
                pending.discard(cell_id)
        if not pending:
            break
    assert not stale, f"{notebook.name}: cells edited after their stored run (re-run it): {stale}"


def test_the_readme_map_links_every_notebook_under_its_track() -> None:
    """The README's map: a link to each notebook, under the track its banner names."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\w+) \| \[[^\]]+\]\(notebooks/(\d\d_[a-z_0-9]+)\.ipynb\) \|", readme, re.M)
    assert sorted(stem for _, stem in rows) == sorted(notebook.stem for notebook in NOTEBOOKS), rows
    for track, stem in rows:
        opening = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", 4).cells[0].source
        assert f"*Track: {track} (" in opening, f"{stem} is under {track} in the README's map"
        # its banner lists its whole track, in the map's order, this notebook in bold
        banner = re.search(r"^\*Track: \w+ \((.*)\)\*$", opening, re.M)
        listed = re.findall(r"\*\*(\d\d)\*\*|\[(\d\d)\]", banner.group(1) if banner else "")
        expected = [other[:2] for kind, other in rows if kind == track]
        assert [bold or linked for bold, linked in listed] == expected, (
            f"{stem}'s banner: {banner and banner[0]}"
        )


OUTPUT_FILE = re.compile(r"\b(\d\d_[a-z_0-9]+\.(?:json|png|yaml|csv))")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_prose_names_only_files_the_code_writes(notebook: Path) -> None:
    """An output file a markdown cell names (``NN_name.json`` …) is one the notebook's code writes:
    no name left over from an earlier numbering."""
    cells = nbformat.read(notebook, 4).cells
    written = {name for c in cells if c.cell_type == "code" for name in OUTPUT_FILE.findall(c.source)}
    named = {name for c in cells if c.cell_type == "markdown" for name in OUTPUT_FILE.findall(c.source)}
    assert named <= written, f"named but not written: {sorted(named - written)}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_chart_has_a_caption_under_it(notebook: Path) -> None:
    """A chart is followed by a markdown cell that says what to see in it."""
    cells = nbformat.read(notebook, 4).cells
    for index, cell in enumerate(cells):
        charted = cell.cell_type == "code" and any(
            "image/png" in output.get("data", {})
            or "<Chart" in str(output.get("data", {}).get("text/plain", ""))
            for output in cell.get("outputs", [])
        )
        if charted:
            after = cells[index + 1] if index + 1 < len(cells) else None
            assert after is not None and after.cell_type == "markdown", (
                f"cell {index}: a chart with no caption under it"
            )


STORED_NOISE = re.compile(r"/root/|/home/[^/\s]+/|/Users/[^/\s]+/|Triton is installed|DeprecationWarning")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_outputs_show_no_home_folder_or_library_noise(notebook: Path) -> None:
    """What a reader sees under a cell is the cell's doing: no path inside someone's home folder
    (it says nothing to another reader), no warning a library printed on import."""
    home = str(Path.home())
    found = []
    for index, cell in enumerate(nbformat.read(notebook, 4).cells):
        for output in cell.get("outputs", []):
            text = str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
            if STORED_NOISE.search(text) or (home != "/" and home in text):
                found.append((index, text[:200]))
    assert not found, f"{notebook.name}: stored outputs with a home path or library noise: {found}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stored_executed_without_widget_state(notebook: Path) -> None:
    stored = nbformat.read(notebook, 4)
    assert "widgets" not in stored.metadata, "re-execute with --ExecutePreprocessor.store_widget_state=False"
    code = [cell for cell in stored.cells if cell.cell_type == "code" and cell.source.strip()]
    assert code and all(cell.execution_count is not None for cell in code), "store the notebook executed"
    ids = [cell["id"] for cell in json.loads(notebook.read_text())["cells"]]
    assert len(set(ids)) == len(ids), "two cells share an id (a copied cell): give the copy its own"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stored_with_the_kernelspec_jupyterlab_writes(notebook: Path) -> None:
    """Opened in JupyterLab, a notebook is not marked modified: its kernelspec is the one Lab
    would write (it renames "Python 3" to "Python 3 (ipykernel)", and closing then asks to save)."""
    spec = nbformat.read(notebook, 4).metadata.get("kernelspec", {})
    assert spec == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}, spec


def export(notebook: Path, cwd: Path, output_dir: Path, to: str = "script", suffix: str = ".py") -> Path:
    """Plain `jupyter nbconvert --to script` (no flags: the installed config removes the cells)."""
    command = [
        "jupyter",
        "nbconvert",
        "--to",
        to,
        os.path.relpath(notebook, cwd),
        "--output-dir",
        str(output_dir),
    ]
    subprocess.run([sys.executable, "-m", *command], cwd=cwd, check=True, capture_output=True, timeout=120)
    return output_dir / (notebook.stem + suffix)


@pytest.mark.processes
@pytest.mark.parametrize("notebook", exports())
def test_plain_export_is_a_program_that_passes_its_smoke_check(notebook: Path, tmp_path: Path) -> None:
    slow_start = notebook.stem in NEEDS_VLLM or notebook.stem in NEEDS_DYNAMO  # its engines take a minute
    script = export(notebook, ROOT, tmp_path)
    from_notebooks = export(notebook, ROOT / "notebooks", tmp_path / "from_notebooks")
    assert from_notebooks.read_text() == script.read_text(), "the export depends on the folder it ran in"
    source = script.read_text()
    ast.parse(source)  # no top-level await left: it is plain Python
    interactive = [
        c for c in nbformat.read(notebook, 4).cells if NOTEBOOK_ONLY_TAG in c.metadata.get("tags", [])
    ]
    assert interactive, "the notebook should tag its interactive cells"
    for cell in interactive:
        assert cell.source.strip() not in source
    result = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        capture_output=True,
        text=True,
        timeout=540 if slow_start else 120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke ok" in result.stdout


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_an_export_imports_only_what_it_uses(notebook: Path) -> None:
    """Client libraries and helpers that only the walk-through uses stay in notebook-only cells."""
    tree = ast.parse(exported_code(notebook))
    imported = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not imported - used, (
        f"imported by exported cells, used only by notebook-only ones: {imported - used}"
    )


@pytest.mark.processes
def test_other_exports_keep_every_cell(tmp_path: Path) -> None:
    markdown = export(NOTEBOOKS[0], ROOT, tmp_path, to="markdown", suffix=".md")
    assert "await DistributedRuntime.create()" in markdown.read_text()


@pytest.mark.processes
@pytest.mark.long  # a whole notebook once more (9 s): CI's opt-in step runs it
def test_a_notebook_runs_in_a_kernel_where_nest_asyncio_was_applied() -> None:
    """SGLang's docs notebooks call ``nest_asyncio.apply()``; a kernel where that ran still runs
    ours top to bottom (the kit itself never patches the loop)."""
    pytest.importorskip("nest_asyncio", reason="nest_asyncio is not installed (the dev extra has it)")
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS[0], 4)
    patch = "import asyncio\n\nimport nest_asyncio\n\nnest_asyncio.apply()\nassert asyncio.run.__module__ == 'nest_asyncio'"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(patch))
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})  # fmt: skip
    client.execute()  # raises CellExecutionError, naming the cell, when one fails
    assert all(
        output.get("output_type") != "error" for cell in notebook.cells for output in cell.get("outputs", [])
    )


@pytest.mark.processes
@pytest.mark.long  # ~40 s: kept out of the default run's budget; .ci/run's second step runs it
def test_one_parameter_points_an_llm_notebook_at_another_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Notebook 02 with ``DYN_NB_MODEL_PATH`` set to another local Hugging Face folder (the
    random model) and ``DYN_NB_DEVICE=cpu``: every cell passes, and the frontend serves that
    model under its folder's name, on the device asked for."""
    from dynamo_nb.models import random_model_path

    folder = random_model_path()
    monkeypatch.setenv("DYN_NB_MODEL_PATH", str(folder))
    monkeypatch.setenv("DYN_NB_DEVICE", "cpu")
    monkeypatch.delenv("DYN_NB_MODEL_NAME", raising=False)
    from nbclient import NotebookClient

    notebook = nbformat.read(ROOT / "notebooks" / "02_serving_an_llm.ipynb", 4)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})  # fmt: skip
    client.execute()  # raises CellExecutionError, naming the cell, when one fails
    printed = [
        "".join(output.get("text", ""))
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    ]
    assert f"{folder.name}\n" in printed, printed[:12]  # what /v1/models answered
    assert any(text.startswith("<HFEngine") and " on cpu," in text for text in printed), printed[:12]


def test_a_worker_started_in_a_cell_keeps_serving_while_no_cell_runs(services: LocalServices) -> None:
    """A real kernel serves over etcd + TCP; this process calls it while the kernel is idle."""
    import jupyter_client

    manager, kernel = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        cell = textwrap.dedent(
            f"""
            import asyncio, dynamo_nb
            async def generate(request, context):
                for word in request["text"].split():
                    await asyncio.sleep(0.01)   # the handler really awaits between items
                    yield {{"word": word}}
            rt = await dynamo_nb.DistributedRuntime.create("{services.etcd_url}", "tcp")
            server = await rt.endpoint("kernel.words.generate").serve(generate)
            print("served", server.instance_id)
            """
        )
        outputs: list[str] = []
        reply = kernel.execute_interactive(
            cell, timeout=60, output_hook=lambda m: outputs.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", outputs
        served_id = int("".join(outputs).split()[-1])

        async def call_while_idle() -> list[Any]:
            await asyncio.sleep(0.5)  # no cell is running now
            async with await DistributedRuntime.create(str(services.etcd_url), "tcp") as rt:
                client = await rt.endpoint("kernel.words.generate").client()
                assert await client.wait_for_instances(timeout=30) == [served_id]
                return [await collect(client.round_robin({"text": f"idle call {i}"})) for i in range(3)]

        results = asyncio.run(call_while_idle())
        assert results == [[{"word": "idle"}, {"word": "call"}, {"word": str(i)}] for i in range(3)]
        status = kernel.execute_interactive("print(server.requests_total)", timeout=30)
        assert status["content"]["status"] == "ok"
    finally:
        kernel.execute_interactive("await rt.shutdown()", timeout=30)
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)


# The KV router's cost, in the words of `docs/kv-routing.md` and the glossary: every notebook that
# explains its parts says it in these words (one definition, not one per notebook).
COST_PARTS = (
    "`prefill_blocks` is the prompt blocks it would compute — its active prompts' and this one's, less the"
    " prefix it holds × `overlap_score_credit` — and `decode_blocks` the KV blocks its running requests hold"
)


def test_the_routers_cost_is_defined_in_one_set_of_words() -> None:
    """06 defines the cost; 11 and 14, which explain a decision by its parts, say it in the same
    words and link to 06 — so two notebooks cannot define the same term differently."""
    explaining = []
    for notebook in NOTEBOOKS:
        prose = " ".join(c.source for c in nbformat.read(notebook, 4).cells if c.cell_type == "markdown")
        if "prefill_blocks" in prose or "prefill_load_scale ×" in prose:
            explaining.append(notebook.stem[:2])
            assert COST_PARTS in prose, f"{notebook.name}: say the cost's parts as 06 does: {COST_PARTS}"
            assert notebook.stem.startswith("06") or "](06_kv_aware_routing.ipynb)" in prose, notebook.name
    assert {"06", "11", "14"} <= set(explaining), explaining


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_checks_a_reader_reads_are_claims_not_asserts(notebook: Path) -> None:
    """A visible cell checks with a `claim` line (the sentence and the values it rests on,
    printed), not an ``assert`` a reader must decode; collapsed cells (helpers, the program's
    smoke checks) may assert."""
    asserting = [
        f"cell {index}: {line.strip()}"
        for index, cell in enumerate(nbformat.read(notebook, 4).cells)
        if cell.cell_type == "code" and not cell.metadata.get("jupyter", {}).get("source_hidden", False)
        for line in cell.source.splitlines()
        if line.lstrip().startswith("assert ")
    ]
    assert not asserting, "\n".join(asserting)
