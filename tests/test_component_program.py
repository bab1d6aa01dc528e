"""A component declared in notebook cells is a program (each notebook's export runs as a process in
test_notebook_workers.py): its parser, its static check, a graph that names the notebook as a service
(dry run, Kubernetes manifests, a real start), a frontend routes with a policy loaded from a
notebook, and a wrong declaration is a clear error at export or check time."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml
from helpers import ROOT, write_notebook

from dynamo_nb import ConfigError, EngineProgram, HandlerProgram, LocalServices, RoutingPolicy, bench, launch
from dynamo_nb.graph import Graph, GraphError, check_graph
from dynamo_nb.graph.kubernetes import kubernetes_manifests
from dynamo_nb.jupyter import NOTEBOOK_ONLY_TAG
from dynamo_nb.launch.programs import check_program_source, export_notebook
from dynamo_nb.llm import PreprocessedRequest
from dynamo_nb.notebook.component_program import find_component, load_component

pytestmark = pytest.mark.timeout(180)

NOTEBOOK = ROOT / "notebooks" / "10_your_own_engine.ipynb"
GRAPH = ROOT / "graphs" / "notebook_engine.yaml"


async def words(request: Any, context: Any = None) -> Any:
    yield {"word": request}


# ----------------------------------------------------------------------------- declarations


def test_a_flag_defined_twice_is_a_clear_error() -> None:
    def own(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-path")  # every engine worker has it already

    from dynamo_nb.engines import EchoEngine

    with pytest.raises(ConfigError, match=r"the flag --model-path is defined twice.*define each flag once"):
        EngineProgram(EchoEngine, flags=own).build_parser()


def test_an_engine_without_from_args_is_refused_when_declared() -> None:
    class NoFactory:
        pass

    with pytest.raises(ConfigError, match="needs a classmethod coroutine from_args"):
        EngineProgram(NoFactory)


def test_find_component_names_what_is_missing_or_doubled() -> None:
    one = HandlerProgram(words, endpoint="t.words.generate")
    two = HandlerProgram(words, endpoint="t.other.generate")
    assert find_component({"worker": one, "alias": one, "words": words}, "nb.ipynb") is one
    with pytest.raises(ConfigError, match=r"nb.ipynb defines no component"):
        find_component({"words": words}, "nb.ipynb")
    with pytest.raises(
        ConfigError,
        match=r"declares 2 of the kind wanted here \(a \(handler\), b \(handler\)\): name one, nb\.ipynb:a$",
    ):
        find_component({"a": one, "b": two}, "nb.ipynb")
    with pytest.raises(ConfigError, match=r"defines no worker .*\(it declares p \(routing policy\)\)"):
        find_component({"p": RoutingPolicy(min)}, "nb.ipynb", runnable=True)
    with pytest.raises(ConfigError, match="p is a routing policy; a worker"):
        find_component({"p": RoutingPolicy(min)}, "nb.ipynb", runnable=True, name="p")


def test_the_static_check_reads_declarations_without_running_them() -> None:
    worker = "worker = EngineProgram(Engine)\n"
    entry = 'if __name__ == "__main__" and not in_notebook():\n    sys.exit(worker.run())\n'
    assert check_program_source(worker + entry, "a.ipynb") == "worker"
    with pytest.raises(ConfigError, match="has no entry point"):
        check_program_source(worker, "a.ipynb")
    with pytest.raises(
        ConfigError, match=r"declares 2 of the kind wanted here \(worker \(engine\), second \(handler\)\)"
    ):
        check_program_source(worker + "second = HandlerProgram(h, endpoint='a.b.c')\n" + entry, "a.ipynb")
    with pytest.raises(ConfigError, match=r"defines no worker .*it declares policy \(routing policy\)"):
        check_program_source("policy = RoutingPolicy(pick)\n" + entry, "a.ipynb")
    assert check_program_source("policy = RoutingPolicy(pick)", "a.ipynb", runnable=False) == "policy"


def test_a_handler_program_serves_in_process_and_parses_its_flags() -> None:
    from dynamo_nb import DistributedRuntime

    program = HandlerProgram(words, endpoint="t.words.generate", deployment={"name": "words"})
    assert program.parse_args(["--endpoint", "t.other.generate"]).endpoint == "t.other.generate"
    assert "usage: words" in program.build_parser().format_usage()

    async def main() -> list[Any]:
        async with await DistributedRuntime.create() as runtime:
            await program.serve(runtime)
            client = await runtime.endpoint("t.words.generate").client()
            await client.wait_for_instances(timeout=10)
            return [item async for item in client.round_robin("hi")]

    assert asyncio.run(main()) == [{"word": "hi"}]


# ----------------------------------------------------------------------------- notebooks


@pytest.mark.processes
def test_a_notebook_without_a_component_is_a_clear_error_in_a_graph(tmp_path: Path) -> None:
    empty = write_notebook(tmp_path / "nothing.ipynb", "x = 1", ("await something()", NOTEBOOK_ONLY_TAG))
    graph = Graph.from_dict({"components": {"w": {"component": str(empty)}}})
    with pytest.raises(GraphError, match=r"components.w.component: .*nothing.ipynb defines no worker"):
        check_graph(graph)
    untagged = write_notebook(tmp_path / "untagged.ipynb", "await something()")
    with pytest.raises(
        ConfigError,
        match=r"untagged.ipynb: cell 1 \('await something\(\)'\) awaits at top level, which only a kernel runs",
    ):
        export_notebook(untagged)


@pytest.mark.processes
def test_the_export_is_cached_by_code_not_outputs(tmp_path: Path) -> None:
    path = write_notebook(tmp_path / "cached.ipynb", "x = 1")
    first = export_notebook(path)
    notebook = nbformat.read(path, 4)
    notebook.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nbformat.write(notebook, path)
    assert export_notebook(path) == first  # outputs changed: the same export
    notebook.cells[0].source = "x = 2"
    nbformat.write(notebook, path)
    changed = export_notebook(path)
    assert changed != first and "x = 2" in changed.read_text()


# ----------------------------------------------------------------------------- graphs


@pytest.mark.processes
def test_a_graph_names_a_notebook_dry_run_prints_the_export_and_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(GRAPH), "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    export_line, worker_line, frontend_line = result.stdout.splitlines()
    assert export_line.startswith(
        "taboo (export): jupyter nbconvert --to script notebooks/10_your_own_engine.ipynb"
    )
    assert (
        worker_line.startswith("taboo: python3 ")
        and "10_your_own_engine.py --taboo the,of --discovery" in worker_line
    )
    assert frontend_line.startswith("frontend: python3 components/frontend.py --http-port 8000")


@pytest.mark.processes
def test_a_notebook_services_flags_are_checked_with_its_exports_parser() -> None:
    graph = Graph.from_yaml(GRAPH)
    graph.services["taboo"].flags["tabu"] = "x"
    with pytest.raises(
        GraphError, match=r"'tabu' is not a flag of notebooks/10_your_own_engine.ipynb; did you mean --taboo"
    ):
        check_graph(graph, cwd=ROOT)


@pytest.mark.processes
def test_the_notebook_services_manifests_export_it_in_an_init_container() -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="the dev extra has kubernetes-validate"
    )
    manifests = kubernetes_manifests(Graph.from_yaml(GRAPH), cwd=ROOT)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.33", strict=True)
    pod = next(m for m in manifests if m["metadata"]["name"] == "notebook-engine-taboo")["spec"]["template"]
    spec = pod["spec"]
    [init] = spec["initContainers"]
    assert init["command"] == ["python3", "-m", "jupyter", "nbconvert", "--to", "script",
                               "notebooks/10_your_own_engine.ipynb", "--output-dir", "/exported"]  # fmt: skip
    [container] = spec["containers"]
    assert container["command"] == ["python3", "/exported/10_your_own_engine.py"]
    assert container["args"][:2] == ["--taboo", "the,of"] and "--system-port" in container["args"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}  # the notebook's DEPLOYMENT
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "taboo-worker"


@pytest.mark.processes
async def test_a_graph_with_a_notebook_service_starts_and_answers(tmp_path: Path) -> None:
    from dynamo_nb.graph import serve

    graph = Graph.from_yaml(GRAPH)
    graph.services["frontend"].flags["http-port"] = 0
    running = await serve(graph, cwd=ROOT, show_logs=False)
    try:
        assert running.url
        await bench.wait_for_model(running.url, "taboo", instances=1, timeout=60)
        df = await bench.run(running.url, "taboo", prompts=["hello"], concurrency=1, requests=2, max_tokens=4,
                             progress=False)  # fmt: skip
        assert df["error"].isna().all() and (df["output_tokens"] == 4).all()
    finally:
        await running.stop()


# ----------------------------------------------------------------------------- routing policies

POLICY_CELL = '''
from dynamo_nb import RoutingPolicy


def by_length(request, instance_ids):
    """Prompts of up to 12 tokens to the lowest instance id, longer ones to the highest."""
    ids = sorted(instance_ids)
    return ids[0] if len(request.token_ids) <= 12 else ids[-1]


policy = RoutingPolicy(by_length)
'''


@pytest.mark.processes
def test_a_policy_is_loaded_from_a_notebook_and_a_py_file(tmp_path: Path) -> None:
    notebook = write_notebook(tmp_path / "policy.ipynb", POLICY_CELL, ("await demo()", NOTEBOOK_ONLY_TAG))
    loaded = load_component(f"{notebook}", runnable=False)
    short = PreprocessedRequest(token_ids=[1, 2])
    assert isinstance(loaded, RoutingPolicy) and loaded(short, [5, 3]) == 3
    assert load_component(f"{notebook}:policy", runnable=False) is loaded
    (tmp_path / "two.py").write_text(POLICY_CELL + "\nother = RoutingPolicy(by_length)\n")
    with pytest.raises(
        ConfigError,
        match=r"declares 2 of the kind wanted here \(policy \(routing policy\), other \(routing policy\)\)",
    ):
        load_component(str(tmp_path / "two.py"), runnable=False)
    with pytest.raises(ConfigError, match="declares no 'nope'"):
        load_component(f"{tmp_path / 'two.py'}:nope", runnable=False)


@pytest.mark.processes
async def test_a_frontend_routes_with_a_policy_from_a_notebook(
    services: LocalServices, tmp_path: Path
) -> None:
    notebook = write_notebook(tmp_path / "policy.ipynb", POLICY_CELL)
    etcd = ["--discovery", str(services.etcd_url)]
    started = []
    try:
        for _ in range(2):
            started.append(await launch(ROOT / "components/mocker_worker.py", *etcd, "--speedup-ratio", 100,
                                        log_dir=tmp_path, show_logs=False))  # fmt: skip
        frontend = await launch(ROOT / "components/frontend.py", *etcd, "--http-port", 0, "--router-policy",
                                f"{notebook}:policy", log_dir=tmp_path, show_logs=False)  # fmt: skip
        started.append(frontend)
        await bench.wait_for_model(frontend.url, "tiny-llama", instances=2, timeout=60)
        ids = sorted(int(p.ready_line.split("instance=")[1].split()[0], 16) for p in started[:2])
        prompts = [bench.Prompt("short", ({"role": "user", "content": "hi"},)),
                   bench.Prompt("long", ({"role": "user", "content": "tell me more " * 10},))]  # fmt: skip
        df = await bench.run(frontend.url, "tiny-llama", prompts=prompts, concurrency=2, requests=8, max_tokens=2,
                             endpoint="completions", progress=False)  # fmt: skip
        assert df["error"].isna().all()
        placed = Counter(zip(df["prompt"], df["worker"], strict=True))
        assert placed == {("short", f"{ids[0]:x}"): 4, ("long", f"{ids[-1]:x}"): 4}
    finally:
        for process in reversed(started):
            await process.stop()


@pytest.mark.processes
def test_a_policy_and_a_router_mode_together_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "components/frontend.py"), "--discovery", "etcd://127.0.0.1:1",
         "--router-mode", "random", "--router-policy", "x.py:p"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--router-policy routes with your policy instead of --router-mode random" in result.stderr


def test_the_declaration_in_notebook_10_is_what_a_graph_reads() -> None:
    from dynamo_nb.graph.defaults import defaults_from_source

    source = "\n".join(c.source for c in nbformat.read(NOTEBOOK, 4).cells if c.cell_type == "code")
    declared = defaults_from_source(source, str(NOTEBOOK))
    assert (declared.name, declared.namespace, declared.resources.cpu) == ("taboo-worker", "dynamo", 1)
    assert (
        yaml.safe_load(GRAPH.read_text())["components"]["taboo"]["component"]
        == "notebooks/10_your_own_engine.ipynb"
    )
