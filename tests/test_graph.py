"""Serving graphs: checked with each component's own parser before anything starts, started from
the example YAML files with real processes, queried, restarted on failure, stopped without orphans."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import ROOT, example_graphs, free_port

from dynamo_nb import DistributedRuntime
from dynamo_nb.errors import ProcessStartError
from dynamo_nb.extras import extra_installed
from dynamo_nb.graph import Graph, GraphError, apply_overrides, check_graph, dry_run, serve
from dynamo_nb.graph.commands import resources_of
from dynamo_nb.graph.defaults import ComponentDefaults, component_defaults, defaults_from_source

pytestmark = pytest.mark.timeout(180)

GRAPHS = ROOT / "graphs"


def graph_with(yaml_text: str) -> Graph:
    return Graph.from_yaml(yaml_text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("components: {fe: {component: components/frontend.py, flags: {http-prot: 1}}}",
         r"components\.fe\.flags: 'http-prot' is not a flag of components/frontend\.py; did you mean --http-port"),
        ("components: {fe: {component: components/frontend.py, flags: {http-port: abc}}}",
         r"components\.fe\.flags: argument --http-port: invalid int value: 'abc'"),
        ("components: {w: {component: components/hf_worker.py, flags: {mode: both}}}",
         r"components\.w\.flags: argument --mode: invalid choice: 'both'"),
        ("components: {w: {component: components/hf_worker.py, flags: {static: maybe}}}",
         r"components\.w\.flags\.static is a switch: write true or false"),
        ("components: {w: {component: components/hf_worker.py, replica: 2}}",
         r"components\.w: unknown key 'replica'"),
        ("components: {w: {component: components/nope.py}}", r"components\.w\.component: components/nope\.py not found"),
        ("components: {a: {component: components/frontend.py, depends_on: [b]},"
         " b: {component: components/frontend.py, depends_on: [a]}}", r"circular depends_on: a -> b -> a"),
        ("components: {a: {component: components/frontend.py, depends_on: [c]}}", r"names 'c', which is not a component"),
        ("components: {w: {component: components/hf_worker.py, resources: {gpu: 1}}}", r"asks for 1 GPU\(s\).*has 0"),
        ("services: {etcd: somewhere}\ncomponents: {w: {component: components/frontend.py}}",
         r"services\.etcd must be 'local' or a URL"),
        ("components: {s: {server: [python, -m, http.server, '8001']}}", r"components\.s\.ready must be the URL"),
        ("components: {s: {server: [python], ready: 'http://127.0.0.1:1/', component: components/frontend.py}}",
         r"components\.s: give component .* or server .*, not both"),
        ("components: {s: {server: [python], ready: 'http://127.0.0.1:1/', replicas: 2}}",
         r"components\.s\.replicas: a server listens on the port its command names"),
        ("components: {s: {server: [python], ready: 'http://127.0.0.1:1/', flags: {port: 1}}}",
         r"components\.s\.flags: a server's flags are part of its command line"),
        ("components: {s: {component: components/frontend.py, ready: 'http://127.0.0.1:1/'}}",
         r"components\.s\.ready belongs to a server"),
    ],
)  # fmt: skip
async def test_a_bad_graph_fails_before_anything_starts_and_names_what_to_fix(
    text: str, message: str
) -> None:
    from dynamo_nb import launched

    before = list(launched())
    with pytest.raises(GraphError, match=message):
        graph = graph_with(text)
        await serve(graph, show_logs=False) if "gpu" not in text else check_graph(graph, gpus=[])
    assert list(launched()) == before  # nothing was started


def test_overrides_win_over_the_file_and_name_bad_targets() -> None:
    graph = Graph.from_yaml(GRAPHS / "disagg_hf.yaml")
    apply_overrides(graph, ["frontend.http-port=8001", "prefill.replicas=1"])
    commands = {c.name: c for c in check_graph(graph, urls={"etcd": "etcd://127.0.0.1:2379"})}
    assert set(commands) == {"prefill", "decode", "frontend"}
    assert commands["frontend"].argv == ["--http-port", "8001", "--discovery", "etcd://127.0.0.1:2379"]
    with pytest.raises(GraphError, match="no component 'router'"):
        apply_overrides(graph, ["router.x=1"])


@pytest.mark.processes
def test_dry_run_prints_each_replicas_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(GRAPHS / "disagg_hf.yaml"), "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["prefill-0", "prefill-1", "decode", "frontend"]
    assert lines[0] == (
        "prefill-0: OMP_NUM_THREADS=1 python3 components/hf_worker.py --mode prefill --discovery 'etcd://<local etcd>'"
    )  # the program relative to the working folder, so the line runs as printed
    bad = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(GRAPHS / "agg_hf.yaml"), "--set", "frontend.http-port=x"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert (
        bad.returncode == 2
        and "components.frontend.flags: argument --http-port: invalid int value" in bad.stderr
    )


@pytest.mark.parametrize("path", example_graphs())
def test_every_example_graph_checks_with_its_components_parsers(path: Path) -> None:
    graph = Graph.from_yaml(path)
    gpus = [str(i) for i in range(8)]  # the GPU graphs are checked as if on an 8-GPU host
    commands = check_graph(
        graph, urls={"etcd": "etcd://127.0.0.1:2379", "nats": "nats://127.0.0.1:4222"}, gpus=gpus
    )
    assert commands and {c.service for c in commands} == set(graph.services)
    assert Graph.from_yaml(graph.to_yaml()) == graph  # YAML round trip


@pytest.mark.parametrize("path", example_graphs())
def test_every_example_graph_has_a_plan_on_a_host_without_gpus(path: Path) -> None:
    """`serve --dry-run` plans any graph on any host: what this one lacks comes first, as comments."""
    graph = Graph.from_yaml(path)
    plan = dry_run(graph, gpus=[], cwd=ROOT).splitlines()
    lacks = [line for line in plan if line.startswith("# this host lacks")]
    commands = [line for line in plan if not line.startswith("#")]
    replicas = check_graph(graph, gpus=[], cwd=ROOT, stand_ins=True)
    assert {c.service for c in replicas} == set(graph.services)
    assert [line.split(": ")[0] for line in commands if " (export)" not in line] == [c.name for c in replicas]
    wanted = sum(
        resources_of(graph.services[name], ROOT / graph.services[name].component).gpu * graph.services[name].replicas
        for name in graph.services
        if graph.services[name].component.endswith(".py")
    )  # fmt: skip
    if wanted:  # each device stands as <gpu N>, and the host's shortfall is said first
        assert lacks[0].startswith(
            f"# this host lacks {wanted} GPU(s): the graph asks for {wanted}, it has 0"
        )
        assert sum(line.count("<gpu ") for line in commands) == wanted
        with pytest.raises(GraphError, match="asks for"):  # a real start refuses
            check_graph(graph, gpus=[], cwd=ROOT)
    needed = {
        module
        for service in graph.services.values()
        if service.component.endswith(".py")
        for module in component_defaults(ROOT / service.component).needs
    }
    for module in needed:
        assert any(line.startswith(f"# this host lacks {module} (") for line in lacks) is not extra_installed(
            module
        )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.processes
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("agg_hf", marks=pytest.mark.long),  # disagg_hf starts the same worker and more
        "disagg_hf",
        "kv_mocker",
        pytest.param("agg_vllm", marks=[pytest.mark.vllm, pytest.mark.timeout(300)]),
        pytest.param("disagg_vllm", marks=[pytest.mark.vllm, pytest.mark.long, pytest.mark.timeout(300)]),
    ],
)
async def test_an_example_graph_starts_from_its_yaml_serves_and_stops_without_orphans(name: str) -> None:
    graph = Graph.from_yaml(GRAPHS / f"{name}.yaml")
    apply_overrides(graph, ["frontend.http-port=0"])
    for service in graph.services.values():
        if "vllm" in service.component:
            service.flags["enforce-eager"] = True  # no torch.compile: a quicker start, the same answers
    running = await serve(graph, show_logs=False)
    try:
        rows = running.status()
        assert {row["service"] for row in rows} == set(graph.services)
        assert all(row["state"] == "running" for row in rows)
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as http:
            for _ in range(100):
                if (await http.get("/v1/models")).json()["data"]:
                    break
                await asyncio.sleep(0.1)
            served = (await http.get("/v1/models")).json()["data"][0]["id"]
            body = {"model": served, "prompt": "hello there", "max_tokens": 4, "temperature": 0}
            response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        if name == "disagg_hf":
            assert response.headers["x-dynamo-path"] == "fast"
        if name == "disagg_vllm":  # vLLM's prefill publishes no bootstrap server: the frontend waits for it
            assert response.headers["x-dynamo-path"] == "fallback"
    finally:
        await running.stop()
    pids = [row["pid"] for row in rows]
    assert all(gone(pid) for pid in pids), running.status()


def server_graph(server_port: int) -> Graph:
    """A running server (the kit's own ``run --in http --out mocker``, standing for ``vllm serve``)
    named in a graph by its command, an upstream worker in front of it, a frontend."""
    return Graph.from_yaml(f"""
name: stock-server
services: {{etcd: local}}
components:
  server:
    server: [python, -m, dynamo_nb, run, --in, http, --out, mocker, --speedup-ratio, "10", --http-port, "{server_port}"]
    ready: http://127.0.0.1:{server_port}/v1/models
  upstream:
    component: components/upstream_worker.py
    flags: {{upstream: "http://127.0.0.1:{server_port}"}}
    depends_on: [server]
  frontend:
    component: components/frontend.py
    flags: {{http-port: 0}}
    depends_on: [upstream]
""")


@pytest.mark.processes
async def test_a_graph_starts_a_server_by_its_command_and_serves_it_behind_the_kit() -> None:
    """A server the graph names by its command line (no READY line: ready once its URL answers),
    an upstream worker in front of it, a frontend: a request answers through the kit, the dry run
    prints the server's command as written, and every process is gone after the stop."""
    from dynamo_nb.graph import dry_run

    port = free_port()
    graph = server_graph(port)
    assert (
        f"server: python3 -m dynamo_nb run --in http --out mocker --speedup-ratio 10 --http-port {port}"
        in dry_run(graph)
    )
    running = await serve(graph, show_logs=False)
    try:
        rows = running.status()
        assert [row["service"] for row in rows] == ["server", "upstream", "frontend"]
        assert running.url is not None and running.url != f"http://127.0.0.1:{port}"  # the frontend's
        async with httpx.AsyncClient(base_url=running.url, timeout=60) as http:
            body = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
            for _ in range(200):  # the upstream worker's card reaches the frontend
                response = await http.post("/v1/completions", json=body)
                if response.status_code != 404:
                    break
                await asyncio.sleep(0.05)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        with pytest.raises(GraphError, match="runs once"):
            await running.scale("server", 2)
    finally:
        await running.stop()
    assert all(gone(row["pid"]) for row in rows), running.status()


@pytest.mark.processes
@pytest.mark.vllm
@pytest.mark.timeout(400)
async def test_the_stock_vllm_graph_serves_two_vllm_servers_behind_the_kv_router() -> None:
    """graphs/upstream_vllm.yaml (its ports made free): two unchanged vLLM servers, an upstream
    worker each relaying vLLM's KV events, a KV-routing frontend; a repeat of a long prompt goes
    to the server that holds it and finds it cached."""
    text = (GRAPHS / "upstream_vllm.yaml").read_text()
    for fixed in ("8000", "8001", "8002", "5557", "5558"):  # whole numbers only (a free port may hold one)
        text = re.sub(rf"\b{fixed}\b", str(free_port()), text)
    running = await serve(Graph.from_yaml(text), show_logs=False, timeout=400)
    try:
        body = {
            "model": "tiny-llama",
            "prompt": "the harbour keeps its ships in rows, " * 20,
            "max_tokens": 2,
        }
        served = []
        async with httpx.AsyncClient(base_url=running.url, timeout=120) as http:
            for _ in range(3):
                response = await http.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                usage = response.json()["usage"]
                served.append(
                    (
                        response.headers["x-dynamo-decode-worker"],
                        usage["prompt_tokens_details"]["cached_tokens"],
                    )
                )
        assert len({worker for worker, _ in served}) == 1 and all(cached > 0 for _, cached in served[1:]), (
            served
        )
    finally:
        await running.stop()


def test_a_server_named_by_its_command_is_refused_for_kubernetes_with_what_to_do() -> None:
    from dynamo_nb.graph.kubernetes import kubernetes_manifests

    with pytest.raises(
        GraphError, match=r"components\.server: .* its own Deployment from its engine's image"
    ):
        kubernetes_manifests(server_graph(8001))


@pytest.mark.processes
async def test_a_killed_replica_restarts_when_its_service_says_on_failure() -> None:
    graph = Graph.from_yaml("components: {echo: {component: components/echo_worker.py, restart: on-failure}}")
    running = await serve(graph, show_logs=False)
    try:
        first = running.process("echo").pid
        running.process("echo").send_signal(signal.SIGKILL)
        await running.process("echo").wait()
        await running.wait_running(timeout=20)  # restarted after a second
        row = running.status()[0]
        assert row["restarts"] == 1 and row["state"] == "running" and row["pid"] != first, row
        running.graph.services["echo"].restart = "no"  # killed again, it stays down: the wait says so
        running.process("echo").send_signal(signal.SIGKILL)
        await running.process("echo").wait()
        with pytest.raises(ProcessStartError, match=r"echo not running after 0.5 s"):
            await running.wait_running(timeout=0.5)
    finally:
        await running.stop()
    assert gone(running.status()[0]["pid"])


@pytest.mark.processes
async def test_a_running_graph_scales_a_service_up_and_down_live() -> None:
    graph = Graph.from_yaml(
        "services: {etcd: local}\ncomponents: {echo: {component: components/echo_worker.py}}"
    )
    running = await serve(graph, show_logs=False)
    runtime = None
    try:
        assert running.services is not None and running.services.etcd_url
        runtime = await DistributedRuntime.create(running.services.etcd_url)
        client = await runtime.endpoint("dynamo.echo.generate").client()
        await client.wait_for_instances(timeout=20)
        await running.scale("echo", 3)
        assert [row["replica"] for row in running.status()] == ["echo", "echo-1", "echo-2"]
        assert graph.services["echo"].replicas == 3
        for _ in range(100):  # discovery follows: the new replicas registered themselves
            if len(client.instance_ids()) == 3:
                break
            await asyncio.sleep(0.1)
        assert len(client.instance_ids()) == 3
        removed = running.process("echo-2").pid
        await running.scale("echo", 2)
        assert [row["replica"] for row in running.status()] == ["echo", "echo-1"] and gone(removed)
        for _ in range(300):  # a clean stop deregisters at once; a lease expires within its 10 s TTL
            if len(client.instance_ids()) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(client.instance_ids()) == 2
        await running.scale("echo", 0)
        assert running.status() == [] and graph.services["echo"].replicas == 0
        await running.scale("echo", 1)  # from nothing: its command line is built and checked again
        assert [row["replica"] for row in running.status()] == ["echo-0"]
        with pytest.raises(GraphError, match="no component 'ehco'; use one of echo"):
            await running.scale("ehco", 1)
    finally:
        if runtime is not None:
            await runtime.shutdown(grace=0)
        rows = running.status()
        await running.stop()
    assert all(gone(row["pid"]) for row in rows)


def test_a_service_without_resources_gets_its_components_declared_defaults() -> None:
    declared = component_defaults(ROOT / "components/sglang_worker.py")
    assert (declared.name, declared.namespace, declared.resources.gpu) == ("sglang-worker", "dynamo", 1)
    text = "components: {w: {component: components/sglang_worker.py, flags: {fake-engine: true}}}"
    with pytest.raises(GraphError, match=r"asks for 1 GPU\(s\).*per replica: w 1.*resources: \{gpu: 0\}"):
        check_graph(Graph.from_yaml(text), gpus=[], cwd=ROOT)
    assert check_graph(Graph.from_yaml(text), gpus=["3"], cwd=ROOT)[0].env == {"CUDA_VISIBLE_DEVICES": "3"}
    explicit = Graph.from_yaml(text.replace("flags:", "resources: {gpu: 0}, flags:"))
    assert check_graph(explicit, gpus=[], cwd=ROOT)[0].env == {}  # written resources win
    assert Graph.from_yaml(explicit.to_yaml()) == explicit  # gpu: 0 survives the round trip


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("DEPLOYMENT = dict(name='w')", "DEPLOYMENT must be a literal mapping"),
        ("DEPLOYMENT = ['w']", "DEPLOYMENT must be a mapping, got list"),
        ("DEPLOYMENT = {'nmae': 'w'}", "DEPLOYMENT has unknown key 'nmae'"),
        ("DEPLOYMENT = {'resources': {'gpu': -1}}", r"DEPLOYMENT\.resources\.gpu must be a whole number"),
        ("DEPLOYMENT = {'needs': 'vllm'}", r"DEPLOYMENT\.needs must be a list of package names, got 'vllm'"),
    ],
)
def test_a_bad_deployment_declaration_is_a_clear_error(source: str, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        defaults_from_source(source, "w.py")
    assert defaults_from_source("x = 1", "w.py") == ComponentDefaults()  # declaring none is fine


@pytest.mark.processes
def test_serve_in_a_terminal_stops_every_replica_on_sigterm() -> None:
    command = [
        sys.executable,
        "-m",
        "dynamo_nb",
        "serve",
        "graphs/agg_hf.yaml",
        "--set",
        "frontend.http-port=0",
    ]
    with subprocess.Popen(
        [*command, "--quiet"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as serving:
        assert serving.stdout is not None
        lines = []
        for line in serving.stdout:  # the status rows, then "serving at URL"
            lines.append(line)
            if line.startswith("serving at "):
                break
        pids = [int(line.split(" pid ")[1].split()[0]) for line in lines if " pid " in line]
        assert len(pids) == 2 and all(not gone(pid) for pid in pids), lines
        serving.send_signal(signal.SIGTERM)
        assert serving.wait(timeout=60) == 0
    assert all(gone(pid) for pid in pids)  # no orphans
