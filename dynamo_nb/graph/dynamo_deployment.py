"""A graph as a ``DynamoGraphDeployment``: what NVIDIA Dynamo's Kubernetes operator deploys.

`dynamo_graph_deployment` renders one object of Dynamo 1.6.1's ``nvidia.com/v1beta1`` API (the
version its operator stores and its own profiler writes): ``spec.components`` holds

- ``Frontend`` (``type: frontend``): Dynamo's own frontend (``python3 -m dynamo.frontend``) from
  ``dynamo_image``, in place of the graph's kit frontend, with the flags both frontends share
  (``--http-port``, ``--router-mode`` round-robin / random / kv); the kit frontend's other flags
  have no place there and are listed in the notes;
- each worker service as itself (``type: worker``, or ``prefill`` / ``decode`` from its
  ``--mode`` or ``--disaggregation-mode``): its program and checked flags from ``image`` with
  ``--runtime dynamo``, so it registers on Dynamo's runtime (discovery and the event plane come
  from the operator's ``DYN_*`` environment, not from ``--discovery``); ``replicas``; its
  ``resources`` (``gpu`` as ``nvidia.com/gpu``); a notebook service's export in an init
  container, as in `dynamo_nb.graph.kubernetes_manifests`; and the cluster secret where it
  applies (a prefill worker's bootstrap server listens on the pod's address);
- a server the graph starts with its own command (``server:``, a stock ``vllm serve``) as a
  second container in the pod of the upstream worker that depends on it, from ``image`` with its
  ``env``, ready when its ``ready`` URL answers (a readiness probe): the worker reaches it on the
  pod's loopback, as the graph wrote it, and the pair scales as one.

What the operator then does that the kit does not: it creates the pods and services, injects
etcd and NATS, and its planner and scaling adapters resize the ``replicas`` of each component.
What does not cross over: a routing policy written in a cell (``--router-policy``) stays in the
kit's frontend; Dynamo's Rust router takes only its own knobs. No cluster is contacted.

Example::

    python -m dynamo_nb serve graphs/disagg_hf.yaml --emit dynamo --image registry.example/dynamo-nb:0.1 > dgd.yaml
    kubectl apply -f dgd.yaml      # on a cluster with Dynamo's operator
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..launch.declarations import split_reference
from .commands import service_argv, service_parser
from .kubernetes import (
    DEFAULT_IMAGE,
    POD_IP,
    _dns_name,
    _program_in_image,
    _resources,
    component_env,
    pod_running,
    secret_name,
    service_env,
)
from .model import Graph, GraphError, Service

__all__ = ["DYNAMO_API_VERSION", "DYNAMO_IMAGE", "DynamoDeployment", "dynamo_graph_deployment"]

DYNAMO_API_VERSION = "nvidia.com/v1beta1"
DYNAMO_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"  # Dynamo's own image: its frontend
FRONTEND_FLAGS = ("http-port", "router-mode")  # what the kit's frontend and Dynamo's both take
DYNAMO_ROUTER_MODES = ("round-robin", "random", "kv")


@dataclass
class DynamoDeployment:
    """A rendered ``DynamoGraphDeployment`` and what did not carry over.

    Attributes:
        manifest: the object (a plain dict: ``apiVersion``, ``kind``, ``metadata``, ``spec``).
        notes: what the rendering left out or changed, one line each (the CLI prints them as
            comments above the YAML).
    """

    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def dynamo_graph_deployment(
    graph: Graph,
    *,
    image: str = DEFAULT_IMAGE,
    dynamo_image: str = DYNAMO_IMAGE,
    namespace: str | None = None,
    workdir: str = "/app",
    cwd: Path | None = None,
    cluster_secret: bool = True,
) -> DynamoDeployment:
    """The graph as one ``DynamoGraphDeployment`` (see the module docstring).

    Raises:
        GraphError: a service the operator cannot run as written (a server no single upstream
            worker depends on, a component without ``--runtime dynamo``, a router mode Dynamo
            lacks).

    Example:
        >>> graph = Graph.from_yaml(
        ...     "components: {frontend: {component: components/frontend.py}, worker: {component: components/mocker_worker.py}}")
        >>> rendered = dynamo_graph_deployment(graph)
        >>> [(c["name"], c["type"]) for c in rendered.manifest["spec"]["components"]]
        [('Frontend', 'frontend'), ('worker', 'worker')]
    """
    cwd = cwd or Path.cwd()
    name = _dns_name(graph.name, "name")
    secret = secret_name(graph) if cluster_secret else None
    notes: list[str] = []
    components: list[dict[str, Any]] = []
    frontends = []
    beside = _servers_beside(graph)
    for service_name in graph.start_order():
        service = graph.services[service_name]
        if service.server is not None:
            continue  # in the pod of the worker that depends on it
        program, argv = service_argv(service, {}, cwd)
        values = service_parser(service, program).parse_args(argv)
        if getattr(values, "http_port", None) is not None:  # the kit's frontend: Dynamo's takes its place
            frontends.append(service_name)
            components.append(_frontend(service, values, dynamo_image, notes))
        else:
            worker = _worker(service, program, values, image, workdir, cwd, secret)
            pod = worker["podTemplate"]["spec"]
            pod["containers"] += [
                _server_container(graph.services[server], image, workdir)
                for server, owner in beside.items()
                if owner == service_name
            ]
            components.append(worker)
    if not frontends:
        notes.append("no frontend in the graph: Dynamo's frontend added as Frontend (port 8000)")
        components.insert(0, _frontend(None, None, dynamo_image, notes))
    elif len(frontends) > 1:
        raise GraphError(f"components: {', '.join(frontends)} are frontends; Dynamo's graph has one Frontend")
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    manifest = {
        "apiVersion": DYNAMO_API_VERSION,
        "kind": "DynamoGraphDeployment",
        "metadata": metadata,
        "spec": {"components": components},
    }
    return DynamoDeployment(manifest, notes)


def _servers_beside(graph: Graph) -> dict[str, str]:
    """Each server service → the one service (its upstream worker) that depends on it.

    Raises:
        GraphError: a server that no service, or more than one, depends on.
    """
    servers = [name for name, service in graph.services.items() if service.server is not None]
    beside = {}
    for server in servers:
        users = sorted(name for name, service in graph.services.items() if server in service.depends_on)
        if len(users) != 1:
            raise GraphError(
                f"components.{server}: a server runs in the pod of the one upstream worker that depends on it "
                f"(depends_on), and {len(users) or 'no'} service{'s' if len(users) != 1 else ''} "
                f"{'do' if len(users) != 1 else 'does'}{': ' + ', '.join(users) if users else ''}"
            )
        beside[server] = users[0]
    return beside


def _server_container(service: Service, image: str, workdir: str) -> dict[str, Any]:
    """A server's command as a container of its worker's pod, with a readiness probe of its
    ``ready`` URL (``http://127.0.0.1:PORT/PATH``)."""
    command = list(service.server or [])
    if command[:1] == ["python"]:  # as `serve` runs it: the image's Python
        command[0] = "python3"
    container: dict[str, Any] = {
        "name": _dns_name(service.name, f"components.{service.name}"),
        "image": image,
        "workingDir": workdir,
        "command": command[:1],
        "args": command[1:],
    }
    if service.env:
        container["env"] = service_env(service)
    if service.resources is not None and (resources := _resources(service.resources)):
        container["resources"] = resources  # a GPU server's nvidia.com/gpu
    if service.ready:
        where = urlsplit(service.ready)
        if where.port is None:
            raise GraphError(f"components.{service.name}.ready: {service.ready!r} has no port to probe")
        probe = {"path": where.path or "/", "port": where.port}
        container["readinessProbe"] = {"httpGet": probe, "periodSeconds": 2, "failureThreshold": 300}
    return container


def _frontend(service: Service | None, values: Any, image: str, notes: list[str]) -> dict[str, Any]:
    args = ["-m", "dynamo.frontend", "--http-port", str((values and values.http_port) or 8000)]
    if service is not None:
        mode = getattr(values, "router_mode", None) or "round-robin"
        if mode not in DYNAMO_ROUTER_MODES:
            raise GraphError(
                f"components.{service.name}.flags.router-mode: {mode!r} is not one of Dynamo's frontend's "
                f"({', '.join(DYNAMO_ROUTER_MODES)}); pick one of those for the operator"
            )
        args += ["--router-mode", mode]
        dropped = sorted(
            str(flag) for flag in service.flags if str(flag).replace("_", "-") not in FRONTEND_FLAGS
        )
        if dropped:
            notes.append(
                f"components.{service.name}: Dynamo's frontend takes none of {', '.join(dropped)} "
                "(the kit frontend's own flags); they are left out"
            )
    container = {"name": "main", "image": image, "command": ["python3"], "args": args}
    replicas = service.replicas if service is not None else 1
    return {
        "name": "Frontend",
        "type": "frontend",
        "replicas": replicas,
        "podTemplate": {"spec": {"containers": [container]}},
    }


def _worker(
    service: Service, program: Path, values: Any, image: str, workdir: str, cwd: Path, secret: str | None
) -> dict[str, Any]:
    if getattr(values, "runtime", None) is None:
        raise GraphError(
            f"components.{service.name}: {service.component} has no --runtime flag, so it cannot run on "
            "Dynamo's runtime (a worker made with dynamo_nb.flags has it)"
        )
    argv = service_argv(service, {}, cwd, {"--bootstrap-host": POD_IP})[1]
    if values.runtime != "dynamo":
        argv += ["--runtime", "dynamo"]
    mode = getattr(values, "mode", None) or getattr(values, "disaggregation_mode", None) or "aggregated"
    kind = mode if mode in ("prefill", "decode") else "worker"
    written, _ = split_reference(service.component)
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "workingDir": workdir,
        "command": ["python3", _program_in_image(written, program, cwd)],
        "args": argv,
        "env": component_env(service, secret),
    }
    pod = pod_running(container, service, program, image, workdir, cwd)
    return {
        "name": _dns_name(service.name, f"components.{service.name}"),
        "type": kind,
        "replicas": service.replicas,
        "podTemplate": {"spec": pod},
    }
