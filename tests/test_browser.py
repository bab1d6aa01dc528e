"""The notebooks in a real JupyterLab, driven by Playwright in Debian's Chromium.

For each notebook: open it, clear its outputs, run all cells, then check what a reader sees —
no error outputs, no traceback or unretrieved task error in any output or launch log box, nothing
printed to stderr, every widget rendered (no "Error displaying widget" / "Loading widget..."),
every chart an image, every Mermaid diagram rendered (none showing Mermaid's parse error instead),
every launch log box's status true to its process (a killed worker reads ``exited -9``) — and that shutting the kernel down from JupyterLab stops every process
the notebook launched (the test leaves one running on purpose first). A screenshot of every
viewport, top to bottom, goes to ``notebooks/build/browser/`` (``01_runtime_basics-00.png``…).

It runs where ``.ci/run`` runs it (``DYN_NB_BROWSER=1``, with ``jupyterlab``, ``playwright``
and a ``chromium`` binary installed) and is skipped with the reason elsewhere. With
``DYN_NB_LAB_PYTHON=/path/to/venv/bin/python`` JupyterLab and its kernels run in that venv
(CI makes one with only ``pip install -e ".[notebook]"`` for the quick notebooks, as a reader
installs them), while Playwright drives it from the test's own. The notebooks
run from a copy (so JupyterLab never writes to the repository's files), next to links to the
repository's other folders and copies of ``docs/`` and the README, so their relative paths
resolve as they do in ``notebooks/``; JupyterLab is started with the README's own arguments, and
every link of every notebook to a file is clicked and must open that file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import NEEDS_DYNAMO, NEEDS_VLLM, ROOT, free_port, pid_alive
from logbox_check import log_box_disagreements
from mermaid_check import SAMPLES, mermaid_problems

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = ROOT / "notebooks" / "build" / "browser"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
BROKEN_WIDGET_TEXTS = ("Error displaying widget", "Loading widget...")

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.timeout(900)]


def chromium_path() -> str | None:
    """Debian's Chromium binary (Playwright's own browser download cannot work offline)."""
    explicit = os.environ.get("DYN_NB_CHROMIUM")
    candidates = (explicit,) if explicit else CHROMIUM_CANDIDATES
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def lab_python() -> str:
    """The Python that runs JupyterLab and its kernels: ``DYN_NB_LAB_PYTHON`` (a venv with only
    the ``notebook`` extra, as a reader installs it), else the test's own."""
    return os.environ.get("DYN_NB_LAB_PYTHON") or sys.executable


def require_browser() -> None:
    """Fail, saying what to install, where a part is missing. The ``browser`` group is opt-in
    (the root conftest.py skips it unless asked for), so a run that gets here asked for it and
    cannot pass without it."""
    missing = [name for name in ("playwright", "psutil") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(f'the browser test needs {", ".join(missing)}: pip install -e ".[browser]"')
    probe = subprocess.run(
        [lab_python(), "-c", "import jupyterlab, ipykernel, dynamo_nb"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.fail(f'{lab_python()} cannot run the notebooks in JupyterLab: pip install -e ".[notebook]" there\n'
                    + probe.stderr.decode()[-500:])  # fmt: skip
    if chromium_path() is None:
        pytest.fail(
            "the browser test needs a chromium binary: apt-get install -y chromium (or set DYN_NB_CHROMIUM)"
        )


def readme_lab_arguments() -> list[str]:
    """What the README starts JupyterLab with (``jupyter lab ARGS``, from the repository's root):
    the test serves the notebooks the way a reader does, so a link that opens nothing for the
    reader opens nothing here."""
    found = re.search(r"&& jupyter lab ([^`]+)`", (ROOT / "README.md").read_text())
    assert found, "the README's command that runs the notebooks (... && jupyter lab ARGS`) is gone"
    return shlex.split(found.group(1))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """JupyterLab on 127.0.0.1 serving a copy of the notebooks, autosave off, its app exposed
    to the page (``window.jupyterapp``) so the test can run commands and read cell models."""
    require_browser()
    work = tmp_path_factory.mktemp("lab")
    for entry in ROOT.iterdir():
        if entry.name == "docs":  # what the notebooks link to, served as files of the root
            shutil.copytree(entry, work / entry.name)
        elif entry.name == "README.md":
            shutil.copy(entry, work / entry.name)
        elif entry.name not in ("notebooks", ".git") and not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    (work / "notebooks").mkdir()
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, work / "notebooks" / notebook.name)
    settings = work.parent / f"{work.name}-settings"
    autosave = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    autosave.parent.mkdir(parents=True)
    autosave.write_text('{"autosave": false}\n')
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}\n')
    windowing = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    windowing.parent.mkdir(parents=True)
    windowing.write_text('{"windowingMode": "none"}\n')  # every cell in the page, not only those in view
    port, token = free_port(), "dynamo-nb-browser-test"
    log = open(work.parent / f"{work.name}-lab.log", "wb")
    server = subprocess.Popen(
        [
            lab_python(), "-m", "jupyterlab", *readme_lab_arguments(), "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
            "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={settings}",
        ],
        stdout=log, stderr=subprocess.STDOUT, cwd=work,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + Path(log.name).read_text()[-3000:])
                time.sleep(0.5)
        served = Path(log.name).read_text()
        assert f"Serving notebooks from local directory: {work}" in served, served[-2000:]  # the root
        yield {"base": base, "token": token, "work": work, "server": server}
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(lab: dict[str, Any]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


# JavaScript run in the page: the open notebook's panel, and its cells as nbformat JSON.
PANEL = "window.jupyterapp.shell.currentWidget"
READY = f"""() => {{
    const panel = window.jupyterapp && {PANEL};
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    return !!(panel && panel.content && panel.context.isReady && kernel && kernel.status === 'idle');
}}"""
CELLS = f"""() => {{
    const cells = {PANEL}.content.model.cells;
    const out = [];
    for (let i = 0; i < cells.length; i++) out.push(cells.get(i).toJSON());
    return out;
}}"""
RUN_ALL = """() => {
    window.__dynRunAll = null;
    window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')
        .then(() => window.jupyterapp.commands.execute('notebook:run-all-cells'))
        .then(ok => { window.__dynRunAll = {ok: ok}; }, err => { window.__dynRunAll = {error: String(err)}; });
}"""
# Run code in the notebook's kernel without adding a cell; resolves with its stdout.
EXECUTE = f"""async code => {{
    const kernel = {PANEL}.sessionContext.session.kernel;
    const future = kernel.requestExecute({{code: code}});
    let text = '';
    future.onIOPub = msg => {{ if (msg.header.msg_type === 'stream') text += msg.content.text; }};
    await future.done;
    return text;
}}"""
# How each process the notebook launched ended ("exited -9", "stopped"), or None while it runs.
LAUNCH_ENDS = """
import json as _json
from dynamo_nb.launch import launcher as _launcher
print(_json.dumps(_launcher._ends()))
"""
# A process launched the way the notebooks launch theirs, left running on purpose; and the
# kernel's Python (the notebooks ran in the venv JupyterLab was started from).
LEAVE_ONE_RUNNING = """
import os, sys
from dynamo_nb import launch
_left_running = await launch(sys.executable, "-c",
    "import time; print('READY', flush=True); time.sleep(600)", name="left-running", show_logs=False)
print(os.getpid(), _left_running.pid, sys.prefix)
"""


def widget_views(page: Any) -> list[dict[str, Any]]:
    """Every output area of the open notebook that the widget renderer drew (the others carry
    their MIME type): whether it holds a widget view, and its text."""
    return page.evaluate(
        f"""() => Array.from({PANEL}.node.querySelectorAll('.jp-OutputArea-output'))
            .filter(n => !n.dataset.mimeType)
            .map(n => ({{view: !!n.querySelector('.jupyter-widgets'), text: n.innerText}}))"""
    )


SCROLLER = f"""() => {{
    const node = {PANEL}.content.node;
    return node.querySelector('.jp-WindowedPanel-outer') || node;
}}"""


def screenshot_every_viewport(page: Any, stem: str) -> list[Path]:
    """Scroll the open notebook from top to bottom, one screenshot per viewport (a tenth of
    each overlaps the one before), so a reviewer sees every output, chart and widget."""
    for old in SCREENSHOTS.glob(f"{stem}*.png"):
        old.unlink()
    height, view = page.evaluate(
        f"() => {{ const s = ({SCROLLER})(); return [s.scrollHeight, s.clientHeight]; }}"
    )
    paths = []
    for index, top in enumerate(range(0, max(int(height), 1), max(int(view * 0.9), 100))):
        page.evaluate(f"top => {{ ({SCROLLER})().scrollTop = top; }}", top)
        page.wait_for_timeout(150)
        paths.append(SCREENSHOTS / f"{stem}-{index:02d}.png")
        page.screenshot(path=str(paths[-1]))
    return paths


DIAGRAM = f"""async index => {{
    const notebook = {PANEL}.content;
    await notebook.scrollToItem(index, 'center');
    const cell = notebook.widgets[index];
    if (cell.rendered === false) cell.rendered = true;
    return true;
}}"""
SHOWN_INSTEAD = f"""i => {{
    const rendered = {PANEL}.content.widgets[i].node.querySelector('.jp-RenderedMarkdown');
    return rendered ? rendered.innerHTML.replace(/<p>[\\s\\S]*?<\\/p>/g, '').slice(0, 600) : 'no rendered markdown';
}}"""
DIAGRAM_STATE = f"""index => {{
    const node = {PANEL}.content.widgets[index].node;
    const diagrams = Array.from(node.querySelectorAll('.jp-RenderedMermaid'));
    if (!diagrams.length || diagrams.some(d => !d.querySelector('svg, img') && !d.classList.contains('jp-mod-warning')))
        return null;  // not rendered yet
    return diagrams.map(d => d.classList.contains('jp-mod-warning') ? 'error: ' + d.innerText.slice(0, 600) : 'ok');
}}"""


def diagram_problems(page: Any, cells: list[dict[str, Any]]) -> list[str]:
    """Each markdown cell with a Mermaid block, scrolled into view until JupyterLab has rendered
    it: what a reader sees instead of each diagram that failed (Mermaid's own parse error, shown
    in an orange box over the raw source), or that a diagram never rendered."""
    problems = []
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] != "markdown" or "```mermaid" not in source:
            continue
        page.evaluate(DIAGRAM, index)
        try:
            handle = page.wait_for_function(DIAGRAM_STATE, arg=index, timeout=30_000, polling=200)
        except Exception:  # Playwright's TimeoutError
            shown = page.evaluate(SHOWN_INSTEAD, index)
            problems.append(f"cell {index}: its Mermaid diagram did not render within 30 s: {shown}")
            continue
        states = handle.json_value()
        expected = source.count("```mermaid")
        if len(states) != expected:
            problems.append(f"cell {index}: {expected} Mermaid blocks, {len(states)} diagrams")
        problems += [f"cell {index}: {state}" for state in states if state != "ok"]
    return problems


# Code a reader must scroll sideways to see: an editor whose lines run past its right edge, or a
# collapsed cell's summary line cut off (the layout has the file browser open).
SIDEWAYS = f"""async () => {{
    const notebook = {PANEL}.content;
    const found = [];
    for (let index = 0; index < notebook.widgets.length; index++) {{
        const cell = notebook.widgets[index];
        if (cell.model.type !== 'code') continue;
        await notebook.scrollToItem(index, 'center');  // an editor lays out its lines in view
        await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
        for (const node of cell.node.querySelectorAll('.cm-scroller, .jp-InputPlaceholder'))
            if (node.scrollWidth > node.clientWidth + 1)
                found.push(`cell ${{index}}: ${{node.scrollWidth}} px of code in ${{node.clientWidth}} px`);
    }}
    return found;
}}"""


# Warnings a notebook provokes on purpose, and says so in its prose: 03 SIGKILLs replicas to show
# the graph restarting them, and the graph warns as it does (a reader should see that).
EXPECTED_STDERR = {"03_graphs": re.compile(r"^\S+ exited with -9; restart \d+ of \d+ in \d+ s$")}


def stderr_noise(name: str, outputs: list[dict[str, Any]]) -> list[str]:
    """Lines notebook ``name`` printed to stderr that it does not mean to: a reader sees them in
    red. Warnings, log lines and progress bars belong in a launch's log box or a widget."""
    expected = EXPECTED_STDERR.get(Path(name).stem)
    return [
        line
        for output in outputs
        if output["output_type"] == "stream" and output.get("name") == "stderr"
        for line in "".join(output.get("text", "")).splitlines()
        if line.strip() and not (expected and expected.match(line.strip()))
    ]


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def browser_notebooks() -> list[Any]:
    params = []
    for notebook in NOTEBOOKS:
        marks = [pytest.mark.vllm, pytest.mark.long] if notebook.stem in NEEDS_VLLM else []
        if notebook.stem in NEEDS_DYNAMO:
            marks = [pytest.mark.dynamo]
        params.append(pytest.param(notebook.name, marks=marks, id=notebook.stem))
    return params


@pytest.mark.parametrize("name", browser_notebooks())
def test_notebook_runs_in_jupyterlab(name: str, lab: dict[str, Any], browser: Any) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    try:
        # reset: a fresh workspace, with only this notebook open
        page.goto(f"{lab['base']}/lab/tree/notebooks/{name}?reset&token={lab['token']}")
        page.wait_for_function(READY, timeout=90_000)
        page.evaluate(RUN_ALL)
        page.wait_for_function("() => window.__dynRunAll !== null", timeout=840_000, polling=500)
        finished = page.evaluate("() => window.__dynRunAll")
        page.wait_for_timeout(1500)  # the last widget views and images render
        shots = screenshot_every_viewport(page, Path(name).stem)
        assert len(shots) > 1, f"{name}: the notebook fits one viewport? ({len(shots)} screenshots)"
        cells = page.evaluate(CELLS)

        code = [cell for cell in cells if cell["cell_type"] == "code" and "".join(cell["source"]).strip()]
        outputs = [output for cell in code for output in cell.get("outputs", [])]
        errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o["output_type"] == "error"]
        assert not errors, f"{name}: error outputs {errors}"
        assert finished == {"ok": True}, f"{name}: run all cells ended with {finished}"
        assert all(cell.get("execution_count") for cell in code), f"{name}: a code cell did not run"

        widgets = [o for o in outputs if WIDGET_MIME in o.get("data", {})]
        views = widget_views(page)
        assert len(views) == len(widgets), f"{name}: {len(widgets)} widget outputs, {len(views)} drawn"
        broken = [
            v["text"] for v in views if not v["view"] or any(bad in v["text"] for bad in BROKEN_WIDGET_TEXTS)
        ]
        assert not broken, f"{name}: widgets did not render: {broken}"
        text = page.evaluate(f"() => {PANEL}.node.innerText")
        assert not [bad for bad in BROKEN_WIDGET_TEXTS if bad in text], f"{name}: a widget did not render"
        for bad in ("Traceback (most recent call last)", "was never retrieved"):  # outputs and log boxes
            at = text.find(bad)
            assert at < 0, f"{name}: {bad!r} shown: {text[max(0, at - 300) : at + 600]}"
        ends = {int(pid): how for pid, how in json.loads(page.evaluate(EXECUTE, LAUNCH_ENDS)).items()}
        boxes = log_box_disagreements(text, ends)
        assert not boxes, f"{name}: a launch log box disagrees with its process: {boxes}"
        noise = stderr_noise(name, outputs)
        assert not noise, f"{name}: printed to stderr (red in an output): {noise[:10]}"
        diagrams = diagram_problems(page, cells)
        assert not diagrams, f"{name}: diagrams a reader sees broken: {diagrams}"
        sideways = page.evaluate(SIDEWAYS)
        assert not sideways, f"{name}: code runs past the right edge: {sideways}"

        charts = [
            o
            for o in outputs
            if str(o.get("data", {}).get("text/plain", "")).startswith(("<Chart", "<Figure"))
        ]
        assert all("image/png" in o["data"] for o in charts), f"{name}: a chart came out as text"
        images = sum("image/png" in o.get("data", {}) for o in outputs)
        shown = page.evaluate(f"() => {PANEL}.node.querySelectorAll('.jp-RenderedImage img').length")
        assert shown == images, f"{name}: {images} images in the outputs, {shown} shown"

        kernel, left, prefix = page.evaluate(EXECUTE, LEAVE_ONE_RUNNING).split()
        kernel_pid, left_pid = int(kernel), int(left)
        expected = subprocess.run(
            [lab_python(), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True
        )
        assert prefix == expected.stdout.strip(), f"{name}: the kernel ran in {prefix}, not in {lab_python()}"
        launched = descendants(kernel_pid)
        assert left_pid in launched
        page.evaluate(f"() => {PANEL}.sessionContext.shutdown()")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(pid_alive(pid) for pid in [kernel_pid, *launched]):
            time.sleep(0.2)
        left = [pid for pid in [kernel_pid, *launched] if pid_alive(pid)]
        assert not left, f"{name}: still running after the kernel shut down from JupyterLab: {left}"
        assert not problems, problems
    finally:
        page.close()


def test_the_mermaid_checker_agrees_with_jupyterlab(lab: dict[str, Any], browser: Any) -> None:
    """JupyterLab's Mermaid draws each of the checker's samples, or shows its parse error, exactly
    as the sample says: the fast check in the README suite follows Mermaid's real grammar."""
    import nbformat

    samples = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})  # fmt: skip
    samples.cells = [
        nbformat.v4.new_markdown_cell(f"```mermaid\n{block}```") for _, block in SAMPLES.values()
    ]
    nbformat.write(samples, lab["work"] / "notebooks" / "mermaid_samples.ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{lab['base']}/lab/tree/notebooks/mermaid_samples.ipynb?reset&token={lab['token']}")
        page.wait_for_function(READY, timeout=90_000)
        drawn = {}
        for index, name in enumerate(SAMPLES):
            page.evaluate(DIAGRAM, index)
            states = page.wait_for_function(
                DIAGRAM_STATE, arg=index, timeout=30_000, polling=200
            ).json_value()
            drawn[name] = states == ["ok"]
        assert drawn == {name: expected for name, (expected, _) in SAMPLES.items()}
        assert drawn == {name: mermaid_problems(block) == [] for name, (_, block) in SAMPLES.items()}
    finally:
        page.close()


# JupyterLab points a markdown link to a file of its root at the file's download URL (and opens
# the file in a tab when clicked); one it could not resolve gets an empty href.
FILE_ANCHORS = """panel => Array.from(panel.node.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown a'))
    .filter(a => { const href = a.getAttribute('href') || ''; return href === '' || href.startsWith(location.origin + '/files/'); })"""
# The open notebook's links to files (not to a place in itself, not to the web), in page order;
# clicking one the way a reader does (JupyterLab's handler, no page navigation), then the path of
# what opened (its kernel, if a notebook, shut down) or null when nothing opened in 15 s.
FILE_LINKS = f"""() => {{
    const panel = {PANEL};
    window.__dynLinksPanel = panel;
    window.addEventListener('click', e => {{ if (e.target.closest('a')) e.preventDefault(); }}, true);
    return ({FILE_ANCHORS})(panel).length;
}}"""
CLICK_LINK = """async index => {
    const app = window.jupyterapp, panel = window.__dynLinksPanel;
    app.shell.activateById(panel.id);
    const anchor = (FILE_ANCHORS)(panel)[index];
    anchor.scrollIntoView();
    anchor.click();
    const deadline = Date.now() + 15000;
    while (Date.now() < deadline) {
        const opened = app.shell.currentWidget;
        if (opened && opened !== panel && opened.context) {
            await opened.context.ready;
            const path = opened.context.path;
            if (opened.sessionContext && opened.sessionContext.session) await opened.sessionContext.shutdown();
            opened.dispose();
            return path;
        }
        await new Promise(resolve => setTimeout(resolve, 100));
    }
    return null;
}""".replace("FILE_ANCHORS", FILE_ANCHORS)


def file_links(notebook: Path) -> list[str]:
    """Each link of the notebook's markdown to a file, resolved against ``notebooks/`` to a path
    from the repository's root, in order (the page's anchors are in the same order)."""
    import nbformat

    targets = []
    for cell in nbformat.read(notebook, 4).cells:
        if cell.cell_type == "markdown":
            for target in re.findall(r"\]\(([^)\s]+)\)", cell.source):
                if not target.startswith(("http://", "https://", "#")):
                    targets.append(os.path.normpath(os.path.join("notebooks", target.split("#")[0])))
    return targets


def open_link(page: Any, index: int) -> str | None:
    """Click the open notebook's ``index``-th file link; the path of what opened. Once more if
    the page lost the click's promise (a tab opened and closed under it), the first time."""
    from playwright.sync_api import Error

    try:
        return str(page.evaluate(CLICK_LINK, index) or "") or None
    except Error:
        page.evaluate(FILE_LINKS)
        return str(page.evaluate(CLICK_LINK, index) or "") or None


def test_every_link_in_a_notebook_opens_what_it_names(lab: dict[str, Any], browser: Any) -> None:
    """Started as the README starts it, JupyterLab opens each notebook's link to another notebook,
    a page of ``docs/`` or the README when a reader clicks it (a link that resolves outside the
    server's root opens nothing and says nothing)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    broken, clicked = [], 0
    try:
        for notebook in NOTEBOOKS:
            page.goto(f"{lab['base']}/lab/tree/notebooks/{notebook.name}?reset&token={lab['token']}")
            page.wait_for_function(READY, timeout=90_000)
            expected = file_links(notebook)
            shown = page.evaluate(FILE_LINKS)
            assert shown == len(expected), (
                f"{notebook.name}: {len(expected)} file links written, {shown} shown"
            )
            for index, target in enumerate(expected):
                opened = open_link(page, index)
                clicked += 1
                if opened != target:
                    broken.append(f"{notebook.name}: the link to {target} opened {opened or 'nothing'}")
            page.evaluate(f"() => {PANEL}.sessionContext.shutdown()")
    finally:
        page.close()
    assert not broken, "\n".join(broken)
    assert clicked >= len(NOTEBOOKS), f"only {clicked} links clicked"
