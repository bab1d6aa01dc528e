"""`serve --emit dynamo`: a graph as a DynamoGraphDeployment for NVIDIA Dynamo's operator, checked
offline and strictly against the schema of the part of Dynamo's v1beta1 API it writes
(tests/schemas/dynamo_graph_deployment_v1beta1.json: an unknown or renamed field fails)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helpers import ROOT, example_graphs

from dynamo_nb.graph import Graph, GraphError
from dynamo_nb.graph.commands import service_parser
from dynamo_nb.graph.dynamo_deployment import dynamo_graph_deployment

SCHEMA = json.loads((Path(__file__).parent / "schemas" / "dynamo_graph_deployment_v1beta1.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def render(path: Path, **options: Any) -> dict[str, Any]:
    return dynamo_graph_deployment(Graph.from_yaml(path), cwd=ROOT, **options).manifest


@pytest.mark.parametrize("path", example_graphs())
def test_every_example_graph_renders_a_valid_deployment(path: Path) -> None:
    graph = Graph.from_yaml(path)
    manifest = dynamo_graph_deployment(graph, cwd=ROOT).manifest
    VALIDATOR.validate(manifest)
    components = {c["name"]: c for c in manifest["spec"]["components"]}
    frontend = components.pop("Frontend")
    assert frontend["podTemplate"]["spec"]["containers"][0]["args"][:2] == ["-m", "dynamo.frontend"]
    workers = [name for name, service in graph.services.items()
               if "frontend" not in service.component and service.server is None]  # fmt: skip
    assert set(components) == set(workers)
    for name, component in components.items():
        service = graph.services[name]
        container = component["podTemplate"]["spec"]["containers"][0]
        assert component["replicas"] == service.replicas
        assert container["args"][-2:] == ["--runtime", "dynamo"]  # on Dynamo's runtime
        program = ROOT / service.component.split(":")[0] if service.component.endswith(".py") else None
        if program is not None:  # the arguments are its program's own, checked by its parser
            values = service_parser(service, program).parse_args(container["args"])
            mode = getattr(values, "mode", None) or getattr(values, "disaggregation_mode", None)
            assert component["type"] == (mode if mode in ("prefill", "decode") else "worker")


def test_a_stock_server_runs_beside_its_upstream_worker_in_one_pod() -> None:
    """graphs/upstream_vllm.yaml: each vLLM server is a second container of its upstream worker's
    pod (the worker reaches it on the pod's loopback, as the graph wrote it), with the server's
    command, environment and a readiness probe of its ready URL; a server that no worker, or two,
    depends on has no pod to go in."""
    graph = Graph.from_yaml(ROOT / "graphs/upstream_vllm.yaml")
    components = {c["name"]: c for c in render(ROOT / "graphs/upstream_vllm.yaml")["spec"]["components"]}
    assert set(components) == {"Frontend", "upstream-a", "upstream-b"}
    for worker, server, port in (("upstream-a", "vllm-a", 8001), ("upstream-b", "vllm-b", 8002)):
        main, beside = components[worker]["podTemplate"]["spec"]["containers"]
        assert f"http://127.0.0.1:{port}" in main["args"] and beside["name"] == server
        assert [beside["command"][0], *beside["args"]] == ["python3", *graph.services[server].server[1:]]
        assert beside["readinessProbe"]["httpGet"] == {"path": "/v1/models", "port": port}
        assert {"name": "OMP_NUM_THREADS", "value": "1"} in beside["env"]
    for shared in (False, True):  # vllm-a then used by no one, or by both workers
        changed = Graph.from_yaml(ROOT / "graphs/upstream_vllm.yaml")
        changed.services["upstream-a"].depends_on = ["vllm-a"] if shared else []
        changed.services["upstream-b"].depends_on = ["vllm-a", "vllm-b"] if shared else ["vllm-b"]
        with pytest.raises(
            GraphError, match=r"components\.vllm-a: a server runs in the pod of the one upstream"
        ):
            dynamo_graph_deployment(changed, cwd=ROOT)


def test_a_renamed_or_unknown_field_fails_the_schema() -> None:
    manifest = render(ROOT / "graphs/disagg_hf.yaml")
    VALIDATOR.validate(manifest)
    renamed = copy.deepcopy(manifest)
    renamed["spec"]["components"][0]["podTemplates"] = renamed["spec"]["components"][0].pop("podTemplate")
    unknown = copy.deepcopy(manifest)
    unknown["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["cmd"] = ["python3"]
    wrong_type = copy.deepcopy(manifest)
    wrong_type["spec"]["components"][0]["type"] = "prefiller"
    for broken, field in ((renamed, "podTemplates"), (unknown, "cmd"), (wrong_type, "prefiller")):
        with pytest.raises(jsonschema.ValidationError, match=field):
            VALIDATOR.validate(broken)


def test_the_frontend_is_dynamos_with_the_flags_both_take() -> None:
    text = """
name: mine
components:
  frontend: {component: components/frontend.py, flags: {http-port: 8123, router-mode: kv, migration-limit: 2}}
  worker: {component: components/mocker_worker.py, replicas: 3}
"""
    rendered = dynamo_graph_deployment(Graph.from_yaml(text), cwd=ROOT, dynamo_image="dynamo:1.6.1")
    by_name = {c["name"]: c for c in rendered.manifest["spec"]["components"]}
    frontend = by_name["Frontend"]
    container = frontend["podTemplate"]["spec"]["containers"][0]
    assert (frontend["name"], frontend["type"], container["image"]) == (
        "Frontend",
        "frontend",
        "dynamo:1.6.1",
    )
    assert container["args"] == ["-m", "dynamo.frontend", "--http-port", "8123", "--router-mode", "kv"]
    assert rendered.notes == [
        "components.frontend: Dynamo's frontend takes none of migration-limit (the kit frontend's own flags); "
        "they are left out"
    ]
    worker = by_name["worker"]
    assert (worker["replicas"], worker["type"]) == (3, "worker")
    least_loaded = text.replace("router-mode: kv", "router-mode: least-loaded")
    with pytest.raises(GraphError, match="'least-loaded' is not one of Dynamo's frontend's"):
        dynamo_graph_deployment(Graph.from_yaml(least_loaded), cwd=ROOT)
    alone = dynamo_graph_deployment(Graph.from_yaml(text.split("  frontend:")[0] + text.split("kv, migration-limit: 2}}\n")[1]), cwd=ROOT)  # fmt: skip
    assert alone.manifest["spec"]["components"][0]["name"] == "Frontend" and "no frontend" in alone.notes[0]


def test_the_cluster_secret_and_gpus_reach_the_workers() -> None:
    manifest = render(ROOT / "graphs/disagg_sglang.yaml")
    prefill = manifest["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]
    assert {"name": "DYN_NB_CLUSTER_SECRET", "valueFrom": {"secretKeyRef": {"name": "disagg-sglang-cluster-secret",
            "key": "secret"}}} in prefill["env"]  # fmt: skip
    assert prefill["resources"]["limits"]["nvidia.com/gpu"] == 1
    open_manifest = render(ROOT / "graphs/disagg_sglang.yaml", cluster_secret=False)
    env = open_manifest["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["env"]
    assert {"name": "DYN_NB_ALLOW_UNAUTHENTICATED", "value": "1"} in env


@pytest.mark.processes
def test_the_command_line_prints_it_with_the_secret_first(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", "graphs/disagg_hf.yaml", "--emit", "dynamo",
         "--image", "registry.example/mine:1", "--namespace", "serving"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "# first: kubectl create secret generic disagg-hf-cluster-secret --namespace serving"
    )
    manifest = yaml.safe_load(done.stdout)
    VALIDATOR.validate(manifest)
    assert manifest["metadata"] == {"name": "disagg-hf", "namespace": "serving"}
    images = {c["podTemplate"]["spec"]["containers"][0]["image"] for c in manifest["spec"]["components"]}
    assert images == {"registry.example/mine:1", "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"}
    alone = tmp_path / "alone.yaml"  # a server no upstream worker depends on: no pod to put it in
    alone.write_text(
        "components:\n  vllm: {server: [vllm, serve, m], ready: 'http://127.0.0.1:8001/v1/models'}\n"
    )
    refused = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(alone), "--emit", "dynamo"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "a server runs in the pod of the one upstream worker" in refused.stderr
