"""What the tests share besides fixtures: paths, modes, small helpers (``from helpers import ...``)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from dynamo_nb import DistributedRuntime
from dynamo_nb.launch.process_group import pid_alive
from dynamo_nb.runtime.addresses import free_port as free_port  # the tests import it from here

ROOT = Path(__file__).resolve().parents[1]
ECHO_WORKER = ROOT / "components" / "echo_worker.py"
HF_WORKER = ROOT / "components" / "hf_worker.py"
MOCKER_WORKER = ROOT / "components" / "mocker_worker.py"
FRONTEND = ROOT / "components" / "frontend.py"

# (discovery, request plane): every combination a user can pick.
MODES = ["memory-inproc", "memory-tcp", "file-tcp", "file-nats", "etcd-tcp", "etcd-nats", "static-nats"]

RuntimeFactory = Callable[[str], Awaitable[DistributedRuntime]]

NEEDS_VLLM = {
    "07_serving_with_vllm",
    "15_your_servers_behind_the_kit",
}  # notebooks that start vLLM engines (marked vllm and long)
NEEDS_DYNAMO = {
    "13_on_nvidia_dynamo"
}  # notebooks that run NVIDIA Dynamo's runtime and frontend (marked dynamo)
LONG_NOTEBOOKS = {
    "09_capacity_planning",
    "12_plan_from_a_trace",
    "14_tune_the_router",
}  # notebooks of half a minute or more of live traffic (rate sweeps, traces sent for real, the
# autoscaler's and the retune loop's live runs), run under nbval in the `long` group (.ci/run's
# second step) and in the browser there, to keep the default run within its 12 minutes on 2 cores

# The default run runs the exported programs of the quick notebooks from the repository root; the
# `exports` group (.ci/run's second step) runs every notebook's, from notebooks/ and from the root.
# nbval runs every notebook in the default run either way: running each notebook's program as
# well would take the default run past its budget on 2 cores.
QUICK_EXPORTS = {"01_runtime_basics", "02_serving_an_llm", "10_your_own_engine"}


async def _holds(result: bool | Awaitable[bool]) -> bool:
    return bool(await result) if inspect.isawaitable(result) else bool(result)


async def collect(stream: Any) -> list[Any]:
    """Every item of an async iterator; an engine's `LLMEngineOutput` items as their dicts."""
    return [item.to_dict() if hasattr(item, "to_dict") else item async for item in stream]


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 30.0,
    step: float = 0.0005,
    what: str | None = None,
) -> None:
    """Poll ``condition()`` (a function, or a coroutine function such as an HTTP scrape) until it
    holds; `TimeoutError` naming ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await _holds(condition()):
        if loop.time() > deadline:
            raise TimeoutError(f"not true within {timeout} s: {what or condition}")
        await asyncio.sleep(step)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the Prometheus sample ``name`` whose labels include ``labels`` (None: no such sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def req(data: dict[str, Any]) -> Any:
    """A `PreprocessedRequest` from its dict form (what engines take)."""
    from dynamo_nb.llm import PreprocessedRequest

    return PreprocessedRequest.from_dict(data)


async def group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """Whether no process of group ``pgid`` is left (zombies are reaped by their parent quickly)."""
    for _ in range(int(timeout / 0.05)):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


async def pid_gone(pid: int, timeout: float = 5.0) -> bool:
    """Wait up to ``timeout`` s for process ``pid`` to be gone; whether it is."""
    for _ in range(int(timeout / 0.05)):
        if not pid_alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def exported_code(notebook: Path) -> str:
    """The code a plain script export of ``notebook`` keeps (its exported cells, joined)."""
    import nbformat

    from dynamo_nb.notebook.export import kept_cells

    cells = nbformat.read(notebook, 4).cells
    return "\n".join(cell.source for cell in kept_cells(cells) if cell.cell_type == "code")


def example_graphs() -> list[Any]:
    """Every graph in graphs/ as a pytest param; one that names a notebook is marked
    ``processes`` (checking it exports the notebook with nbconvert)."""
    import pytest

    return [
        pytest.param(
            path, id=path.stem, marks=[pytest.mark.processes] if ".ipynb" in path.read_text() else []
        )
        for path in sorted((ROOT / "graphs").glob("*.yaml"))
    ]


def write_notebook(path: Path, *cells: str | tuple[str, str], ran_in_kernel: bool = True) -> Path:
    """A notebook of code cells; a ``(source, tag)`` pair is a tagged cell. ``ran_in_kernel``:
    with the ``language_info`` a Python kernel writes (nbconvert's script export picks the Python
    exporter by it); False: as ``nbformat`` writes a notebook that never ran, without it."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    if ran_in_kernel:
        notebook.metadata["language_info"] = {
            "name": "python",
            "file_extension": ".py",
            "nbconvert_exporter": "python",
        }
    for cell in cells:
        source, tag = cell if isinstance(cell, tuple) else (cell, None)
        made = nbformat.v4.new_code_cell(source)
        if tag:
            made.metadata["tags"] = [tag]
        notebook.cells.append(made)
    nbformat.write(notebook, path)
    return path


@contextlib.asynccontextmanager
async def hf_frontends(
    *configs: dict[str, Any], model: str = "tiny-llama", pair: bool = False
) -> AsyncIterator[list[Any]]:
    """The hf engine (the built-in tiny model) serving ``model`` in this process, behind one
    frontend per ``configs`` entry (its `FrontendConfig` fields; none given: one frontend);
    ``pair``: a prefill and a decode engine (disaggregated, the KV over the bootstrap server)."""
    from dynamo_nb.disagg.modes import DEFAULT_PREFILL_ENDPOINT, WorkerRole
    from dynamo_nb.engines.engine_worker import serve_engine
    from dynamo_nb.engines.hf import HFEngine
    from dynamo_nb.frontend import Frontend
    from dynamo_nb.models import tiny_model_path

    async with await DistributedRuntime.create() as runtime:
        roles = [WorkerRole()]
        if pair:
            roles = [WorkerRole(mode="prefill", endpoint=DEFAULT_PREFILL_ENDPOINT), WorkerRole(mode="decode")]
        engines = []
        for role in roles:
            engine = await HFEngine.load(tiny_model_path())
            engines.append(engine)
            await serve_engine(
                runtime, role, tiny_model_path(), model, lambda kv_events, engine=engine: engine
            )
        fronts = [await Frontend.start(runtime, port=0, **config) for config in configs or ({},)]
        try:
            for front in fronts:
                await front.wait_for_model(model)
                if pair:
                    await until(lambda front=front: front.models.prefill_planner(model) is not None,
                                what="the frontend learns the prefill worker")  # fmt: skip
            yield fronts
        finally:
            for front in fronts:
                await front.stop()
            for engine in engines:
                await engine.close()


def random_schema(draw: random.Random, depth: int = 0) -> dict[str, Any]:
    """A JSON schema of bounded size (so a grammar can finish within the tokens asked for)."""
    kinds = ["integer", "boolean", "string", "enum"] + (["object", "array"] if depth < 2 else [])
    kind = draw.choice(kinds)
    if kind == "integer":
        low = draw.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + draw.randint(0, 100)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "string":
        return {"type": "string", "maxLength": draw.randint(1, 6)}
    if kind == "enum":
        return {"enum": draw.sample(["red", "green", "blue", 3, None, True], draw.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": random_schema(draw, depth + 1), "maxItems": draw.randint(0, 3)}
    names = draw.sample(["id", "name", "ok", "size", "tags", "kind", "when"], draw.randint(1, 3))
    return {
        "type": "object",
        "properties": {name: random_schema(draw, depth + 1) for name in names},
        "required": names,
        "additionalProperties": False,
    }
