"""Serving graphs: checked with each component's own parser before anything starts, started from
the example YAML files with real processes, queried, restarted on failure, stopped without orphans."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import ROOT

from dynamo_nb.graph import Graph, GraphError, apply_overrides, check_graph, serve

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


def test_dry_run_prints_each_replicas_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(GRAPHS / "disagg_hf.yaml"), "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["prefill-0", "prefill-1", "decode", "frontend"]
    assert "components/hf_worker.py --mode prefill --discovery 'etcd://<local etcd>'" in lines[0]
    assert lines[0].startswith("prefill-0: OMP_NUM_THREADS=1 python3 ")
    bad = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(GRAPHS / "agg_hf.yaml"), "--set", "frontend.http-port=x"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert (
        bad.returncode == 2
        and "components.frontend.flags: argument --http-port: invalid int value" in bad.stderr
    )


@pytest.mark.parametrize("path", sorted(GRAPHS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_graph_checks_with_its_components_parsers(path: Path) -> None:
    graph = Graph.from_yaml(path)
    if any("vllm_worker" in s.component for s in graph.services.values()):
        pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm]')")
    gpus = [str(i) for i in range(8)]  # the GPU graphs are checked as if on an 8-GPU host
    commands = check_graph(
        graph, urls={"etcd": "etcd://127.0.0.1:2379", "nats": "nats://127.0.0.1:4222"}, gpus=gpus
    )
    assert commands and {c.service for c in commands} == set(graph.services)
    assert Graph.from_yaml(graph.to_yaml()) == graph  # YAML round trip


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("name", ["agg_hf", "disagg_hf", "kv_mocker"])
async def test_an_example_graph_starts_from_its_yaml_serves_and_stops_without_orphans(name: str) -> None:
    graph = Graph.from_yaml(GRAPHS / f"{name}.yaml")
    apply_overrides(graph, ["frontend.http-port=0"])
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
    finally:
        await running.stop()
    pids = [row["pid"] for row in rows]
    assert all(gone(pid) for pid in pids), running.status()


async def test_a_killed_replica_restarts_when_its_service_says_on_failure() -> None:
    graph = Graph.from_yaml("components: {echo: {component: components/echo_worker.py, restart: on-failure}}")
    running = await serve(graph, show_logs=False)
    try:
        first = running.process("echo").pid
        running.process("echo").send_signal(signal.SIGKILL)
        for _ in range(200):
            row = running.status()[0]
            if row["restarts"] == 1 and row["state"] == "running" and row["pid"] != first:
                break
            await asyncio.sleep(0.1)
        assert row["restarts"] == 1 and row["state"] == "running" and row["pid"] != first, row
    finally:
        await running.stop()
    assert gone(running.status()[0]["pid"])
