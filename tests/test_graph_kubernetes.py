"""A graph's Kubernetes manifests validate against Kubernetes' own OpenAPI schemas (offline, with
`kubernetes-validate`; no cluster) and carry the launcher's command lines; a worker's system
status server answers the probes the manifests point at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers import ROOT, example_graphs, free_port

from dynamo_nb import DistributedRuntime, launch
from dynamo_nb.graph import Graph, GraphError, check_graph, kubernetes_manifests, manifests_yaml
from dynamo_nb.graph.cli import serve_main
from dynamo_nb.runtime.system_status import start_system_status

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')"
)

pytestmark = pytest.mark.timeout(120)

KUBERNETES = "1.33"


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


@pytest.mark.parametrize("path", example_graphs())
def test_every_example_graphs_manifests_validate_against_the_kubernetes_schema(path: Path) -> None:
    if any(service.server is not None for service in Graph.from_yaml(path).services.values()):
        with pytest.raises(GraphError, match="not rendered for Kubernetes"):  # a stock server: said so
            kubernetes_manifests(Graph.from_yaml(path), cwd=ROOT)
        return
    manifests = yaml.safe_load_all(manifests_yaml(kubernetes_manifests(Graph.from_yaml(path), cwd=ROOT)))
    kinds = []
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)  # raises on any deviation
        kinds.append(manifest["kind"])
    graph = Graph.from_yaml(path)
    assert kinds.count("Deployment") == len(graph.services)
    assert kinds.count("Service") == len(graph.services) + kinds.count("StatefulSet")


def test_the_schema_check_catches_a_broken_manifest() -> None:
    deployment = by_kind(
        kubernetes_manifests(Graph.from_yaml(ROOT / "graphs/agg_hf.yaml"), cwd=ROOT), "Deployment"
    )
    broken = next(iter(deployment.values()))
    broken["spec"]["template"]["spec"]["containers"][0]["port"] = 8000  # not a container field
    with pytest.raises(kubernetes_validate.ValidationError, match="'port' was unexpected"):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_deployments_run_the_launchers_command_lines_with_the_pods_addresses() -> None:
    graph = Graph.from_yaml(ROOT / "graphs/disagg_hf.yaml")
    manifests = kubernetes_manifests(graph, image="registry.example/dynamo-nb:1", namespace="llm", cwd=ROOT)
    deployments = by_kind(manifests, "Deployment")
    prefill = deployments["disagg-hf-prefill"]
    assert prefill["metadata"]["namespace"] == "llm" and prefill["spec"]["replicas"] == 2
    container = prefill["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/dynamo-nb:1"
    assert container["command"] == ["python3", "components/hf_worker.py"]
    local = {
        c.service: c.argv for c in check_graph(graph, urls={"etcd": "etcd://disagg-hf-etcd:2379"}, cwd=ROOT)
    }
    # the launcher's flags, then where the pod listens (its IP from the downward API) and its probes
    assert container["args"] == [
        *local["prefill"],
        "--tcp-host", "$(POD_IP)", "--bootstrap-host", "$(POD_IP)",
        "--system-host", "0.0.0.0", "--system-port", "9090",
    ]  # fmt: skip
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in container["env"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "system"}
    frontend = deployments["disagg-hf-frontend"]["spec"]["template"]["spec"]["containers"][0]
    assert frontend["args"][:2] == ["--http-port", "8000"] and "--http-host" in frontend["args"]
    assert frontend["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    services = by_kind(manifests, "Service")
    assert services["disagg-hf-frontend"]["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http"}
    ]
    assert "disagg-hf-etcd" in by_kind(manifests, "StatefulSet")


def test_gpus_become_nvidia_limits_and_urls_are_used_as_written() -> None:
    graph = Graph.from_yaml(ROOT / "graphs/disagg_sglang.yaml")
    graph.shared = {"etcd": "etcd://etcd.infra:2379", "nats": "nats://nats.infra:4222"}
    manifests = kubernetes_manifests(graph, cwd=ROOT)
    assert "StatefulSet" not in {m["kind"] for m in manifests}  # existing services are referenced
    gpus = {
        name: m["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
        for name, m in by_kind(manifests, "Deployment").items()
    }
    assert gpus["disagg-sglang-prefill"] == {"nvidia.com/gpu": 1}
    assert gpus["disagg-sglang-frontend"] == {
        "cpu": "1",
        "memory": "1Gi",
    }  # components/frontend.py's DEPLOYMENT
    args = by_kind(manifests, "Deployment")["disagg-sglang-decode"]["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    assert args[args.index("--discovery") + 1] == "etcd://etcd.infra:2379"
    assert args[args.index("--nats-url") + 1] == "nats://nats.infra:4222"


def test_a_name_kubernetes_cannot_take_is_a_clear_error() -> None:
    graph = Graph.from_yaml("name: My Graph\ncomponents: {fe: {component: components/frontend.py}}")
    with pytest.raises(GraphError, match="name 'My Graph' cannot name a Kubernetes object"):
        kubernetes_manifests(graph, cwd=ROOT)


@pytest.mark.processes
def test_emit_k8s_prints_the_manifests() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynamo_nb",
            "serve",
            "graphs/kv_mocker.yaml",
            "--emit",
            "k8s",
            "--image",
            "x:1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert {d["kind"] for d in documents} == {"StatefulSet", "Deployment", "Service"}
    assert "&id" not in result.stdout  # no YAML aliases: every object stands alone


async def test_system_status_is_ready_once_an_endpoint_is_served() -> None:
    runtime = await DistributedRuntime.create("memory")
    url = await start_system_status(runtime, "127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        assert (await http.get("/live")).status_code == 200
        starting = await http.get("/health")
        assert starting.status_code == 503 and starting.json()["status"] == "starting"

        async def generate(request: Any, context: Any) -> Any:
            yield request

        await runtime.endpoint("dyn.worker.generate").serve(generate)
        ready = await http.get("/health")
        assert ready.status_code == 200 and ready.json() == {
            "status": "ready",
            "endpoints": ["dyn.worker.generate"],
            "inflight": {"dyn.worker.generate": 0},
        }
        await runtime.shutdown(grace=0)
        with pytest.raises(httpx.ConnectError):  # the server closes with the runtime
            await http.get("/live")


@pytest.mark.processes
@pytest.mark.parametrize(("flags", "event_loop"), [([], "uvloop"), (["--no-uvloop"], "asyncio")])
async def test_a_worker_process_answers_health_on_its_system_port(flags: list[str], event_loop: str) -> None:
    """...and runs on uvloop (installed with the serving extras) unless told not to."""
    port = free_port()
    worker = await launch(
        ROOT / "components/echo_worker.py",
        "--system-port",
        str(port),
        *flags,
        cwd=ROOT,
        show_logs=False,
        timeout=60,
    )
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            health = await http.get(f"http://127.0.0.1:{port}/health")
            live = await http.get(f"http://127.0.0.1:{port}/live")
        assert health.status_code == 200 and health.json()["status"] == "ready"
        assert live.json() == {"status": "live", "event_loop": event_loop}
    finally:
        await worker.stop(timeout=10)


def test_components_declared_resources_and_names_reach_the_manifests() -> None:
    manifests = kubernetes_manifests(Graph.from_yaml(ROOT / "graphs/agg_hf.yaml"), cwd=ROOT)
    worker = by_kind(manifests, "Deployment")["agg-hf-worker"]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    # agg_hf.yaml names no resources: components/hf_worker.py's DEPLOYMENT does
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "hf-worker"


def test_every_component_requires_the_cluster_secret_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    graph = Graph.from_yaml(ROOT / "graphs/disagg_hf.yaml")
    secret_env = {
        "name": "DYN_NB_CLUSTER_SECRET",
        "valueFrom": {"secretKeyRef": {"name": "disagg-hf-cluster-secret", "key": "secret"}},
    }
    deployments = by_kind(kubernetes_manifests(graph, cwd=ROOT), "Deployment")
    for deployment in deployments.values():
        assert secret_env in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    plain = by_kind(kubernetes_manifests(graph, cwd=ROOT, cluster_secret=False), "Deployment")
    for deployment in plain.values():
        names = [env["name"] for env in deployment["spec"]["template"]["spec"]["containers"][0]["env"]]
        assert "DYN_NB_CLUSTER_SECRET" not in names
        assert "DYN_NB_ALLOW_UNAUTHENTICATED" in names  # else a pod on its address refuses to start
    assert serve_main([str(ROOT / "graphs/disagg_hf.yaml"), "--emit", "k8s"]) == 0
    emitted = capsys.readouterr()
    command = 'kubectl create secret generic disagg-hf-cluster-secret --from-literal=secret="$(openssl rand -hex 32)"'
    assert emitted.out.startswith(f"# first: {command}\n") and command in emitted.err
    assert len(list(yaml.safe_load_all(emitted.out))) == len(plain) * 2 + 2  # + etcd's StatefulSet, Service
