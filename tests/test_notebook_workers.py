"""Every notebook that declares a component exports, with a plain ``jupyter nbconvert --to script``,
to a program that runs as a process of its own over etcd and over file discovery: 01's handler
answers a client, 02's and 10's LLM workers answer the ``openai`` client through
components/frontend.py, and 06's routing policy, loaded by components/frontend.py from the
notebook, decides where each request goes (checked in the load generator's records)."""

from __future__ import annotations

import ast
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from helpers import FRONTEND, MOCKER_WORKER, ROOT, collect, exported_code

from dynamo_nb import DistributedRuntime, LocalServices, bench, launch
from dynamo_nb.launch import ManagedProcess
from dynamo_nb.launch.declarations import DECLARED_KINDS
from dynamo_nb.launch.programs import export_notebook

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

NOTEBOOKS = ROOT / "notebooks"
# the notebooks whose exported cells declare a component, and what they declare
COMPONENTS = {
    "01_runtime_basics": "HandlerProgram",
    "02_serving_an_llm": "EngineProgram",
    "06_kv_aware_routing": "RoutingPolicy",
    "10_your_own_engine": "EngineProgram",
}
TALKS = {"role": "user", "content": "Tell me about the frontend and the workers."}


def declarations(notebook: Path) -> list[str]:
    """What the cells a script export keeps declare at module level (HandlerProgram, …)."""
    code = exported_code(notebook)
    kinds = set(DECLARED_KINDS)
    return [
        node.value.func.id
        for node in ast.parse(code).body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id in kinds
    ]


def test_every_notebook_that_declares_a_component_is_run_here() -> None:
    found = {path.stem: declarations(path) for path in sorted(NOTEBOOKS.glob("*.ipynb"))}
    assert {stem: kinds for stem, kinds in found.items() if kinds} == {
        stem: [kind] for stem, kind in COMPONENTS.items()
    }


async def discovery_of(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """A discovery URL: a local etcd of this test's, or a folder."""
    if kind == "file":
        yield f"file://{tmp_path / 'discovery'}"
        return
    services = await LocalServices.start(nats=False)
    try:
        yield str(services.etcd_url)
    finally:
        await services.stop()


@pytest.fixture(params=["etcd", "file"])
async def discovery(request: Any, tmp_path: Path) -> AsyncIterator[str]:
    """A discovery URL: a local etcd of this test's, or a folder."""
    async for url in discovery_of(request.param, tmp_path):
        yield url


@pytest.fixture(params=["etcd", pytest.param("file", marks=pytest.mark.long)])
async def llm_discovery(request: Any, tmp_path: Path) -> AsyncIterator[str]:
    """As `discovery`, the folder's case in the long group (an LLM worker and a frontend each)."""
    async for url in discovery_of(request.param, tmp_path):
        yield url


async def start(started: list[ManagedProcess], program: Path, *flags: Any, log_dir: Path) -> ManagedProcess:
    process = await launch(program, *flags, "--log-level", "WARNING", log_dir=log_dir, show_logs=False)
    started.append(process)
    return process


async def stop_all(started: list[ManagedProcess]) -> None:
    for process in reversed(started):
        assert await process.stop() == 0, process.tail()


def stored_output(notebook: str, marker: str) -> str:
    """The text a cell of ``notebook`` whose source contains ``marker`` printed, as stored."""
    for cell in nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", 4).cells:
        if cell.cell_type == "code" and marker in cell.source:
            return "".join(output.get("text", "") for output in cell.get("outputs", []))
    raise AssertionError(f"{notebook} has no cell with {marker!r}")


async def test_notebook_01_exports_a_handler_worker(discovery: str, tmp_path: Path) -> None:
    """``launch`` takes the notebook itself and runs its export."""
    started: list[ManagedProcess] = []
    try:
        worker = await start(started, NOTEBOOKS / "01_runtime_basics.ipynb", "--discovery", discovery, "--endpoint", "nbw.words.generate",
                             log_dir=tmp_path)  # fmt: skip
        assert worker.ready_line.startswith("READY nbw.words.generate instance=")
        async with await DistributedRuntime.create(discovery, "tcp") as runtime:
            client = await runtime.endpoint("nbw.words.generate").client()
            await client.wait_for_instances(timeout=30)
            words = await collect(client.round_robin({"text": "from a notebook"}))
        assert [item["word"] for item in words] == ["from", "a", "notebook"]
    finally:
        await stop_all(started)


@pytest.mark.parametrize(
    ("notebook", "model", "flags"),
    [("02_serving_an_llm", "tiny-llama", []), ("10_your_own_engine", "taboo", ["--taboo", "the,of"])],
)
async def test_an_llm_notebook_exports_a_worker_behind_the_frontend(
    notebook: str, model: str, flags: list[str], llm_discovery: str, tmp_path: Path
) -> None:
    """The greedy answer through the exported worker is the one the notebook stored from its kernel."""
    from openai import AsyncOpenAI

    script = export_notebook(NOTEBOOKS / f"{notebook}.ipynb")
    started: list[ManagedProcess] = []
    try:
        worker = await start(started, script, "--discovery", llm_discovery, *flags, log_dir=tmp_path)
        assert (
            worker.ready_line.startswith("READY dynamo.backend.generate")
            and f"model={model}" in worker.ready_line
        )
        frontend = await start(
            started, FRONTEND, "--discovery", llm_discovery, "--http-port", 0, log_dir=tmp_path
        )
        await bench.wait_for_model(frontend.url, model, instances=1, timeout=60)
        async with AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="none") as client:
            if notebook == "02_serving_an_llm":
                messages = [{"role": "user", "content": "What does os.path.join do?"}]
                answer = await client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                                              temperature=0)  # fmt: skip
                printed = stored_output(notebook, "the frontend adds nothing").splitlines()
                stored = ast.literal_eval(next(line for line in printed if line.startswith(("'", '"'))))
            else:
                answer = await client.chat.completions.create(model=model, messages=[TALKS], max_tokens=40,
                                                              temperature=0)  # fmt: skip
                stored = (
                    stored_output(notebook, 'print("taboo:", taboo_text)').split("\ntaboo: ")[1].rstrip("\n")
                )
        assert answer.choices[0].message.content == stored
    finally:
        await stop_all(started)


async def test_notebook_05s_routing_policy_steers_a_frontend_process(discovery: str, tmp_path: Path) -> None:
    """components/frontend.py --router-policy notebooks/06_kv_aware_routing.ipynb over 4 mocker
    engines: each system prompt stays on one engine, two system prompts per engine."""
    started: list[ManagedProcess] = []
    groups = [
        bench.shared_prefix_prompts(3, system_words=120, user_words=6, seed=group) for group in range(8)
    ]
    prompts = [bench.Prompt(f"system-{g}", groups[g][turn].messages) for turn in range(3) for g in range(8)]
    try:
        await start(started, MOCKER_WORKER, "--discovery", discovery, "--num-workers", 4, "--speedup-ratio", 100,
                    log_dir=tmp_path)  # fmt: skip
        frontend = await start(started, FRONTEND, "--discovery", discovery, "--http-port", 0, "--router-policy",
                               NOTEBOOKS / "06_kv_aware_routing.ipynb", log_dir=tmp_path)  # fmt: skip
        await bench.wait_for_model(frontend.url, "tiny-llama", instances=4, timeout=60)
        df = await bench.run(frontend.url, "tiny-llama", prompts=prompts, concurrency=4, requests=len(prompts),
                             max_tokens=2, progress=False)  # fmt: skip
    finally:
        await stop_all(started)
    assert df["error"].isna().all(), df["error"].dropna().tolist()[:1]
    engines_per_prompt = df.groupby("prompt")["worker"].nunique()
    assert len(engines_per_prompt) == 8 and engines_per_prompt.eq(1).all(), engines_per_prompt.to_dict()
    assert sorted(df.groupby("worker")["prompt"].nunique()) == [2, 2, 2, 2]


async def test_the_export_cache_is_plain_nbconvert_output(tmp_path: Path) -> None:
    """What the runs above started is what ``jupyter nbconvert --to script`` writes, byte for byte."""
    notebook = NOTEBOOKS / "01_runtime_basics.ipynb"
    command = ["jupyter", "nbconvert", "--to", "script", str(notebook), "--output-dir", str(tmp_path)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, stderr.decode()
    assert (tmp_path / "01_runtime_basics.py").read_text() == export_notebook(notebook).read_text()
