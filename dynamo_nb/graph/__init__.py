"""Serving graphs: every component of a deployment, its replicas, flags and resources, in one
object built in Python or loaded from YAML, checked with each component's own parser and
started in dependency order (``python -m dynamo_nb serve graph.yaml``, or ``await serve(graph)``).

- ``model.py``: `Graph`, `Service`, `Resources`, `GraphError` (YAML in and out);
- ``commands.py``: the command lines, checked before anything starts (`check_graph`, `dry_run`);
- ``serve.py``: `serve` and `RunningGraph` (status, restarts on failure, stop);
- ``defaults.py``: what a component declares about its own deployment (``DEPLOYMENT``), read
  from its file without running it;
- ``cli.py``: ``python -m dynamo_nb serve graph.yaml`` (start it, ``--dry-run``, ``--emit k8s|dynamo``);
- ``kubernetes.py``: `kubernetes_manifests` (Deployments, Services, etcd/NATS; ``--emit k8s``);
- ``dynamo_deployment.py``: `dynamo_graph_deployment` (a ``DynamoGraphDeployment`` for NVIDIA
  Dynamo's operator; ``--emit dynamo``);
- ``image.py``: the build context of your own image, the graph's own files on top of the kit's.

Example:
    >>> graph = Graph.from_yaml("components: {frontend: {component: components/frontend.py, flags: {http-port: 8000}}}")
    >>> [command.argv for command in check_graph(graph)]
    [['--http-port', '8000']]
"""

from __future__ import annotations

from .commands import ReplicaCommand, apply_overrides, check_graph, dry_run, flag_argv
from .dynamo_deployment import DynamoDeployment, dynamo_graph_deployment
from .kubernetes import kubernetes_manifests, manifests_yaml
from .model import Graph, GraphError, Resources, Service
from .serve import RunningGraph, serve

__all__ = [
    "DynamoDeployment",
    "Graph",
    "GraphError",
    "ReplicaCommand",
    "Resources",
    "RunningGraph",
    "Service",
    "apply_overrides",
    "check_graph",
    "dry_run",
    "dynamo_graph_deployment",
    "flag_argv",
    "kubernetes_manifests",
    "manifests_yaml",
    "serve",
]
