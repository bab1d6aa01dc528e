"""Kubernetes manifests for a graph: the same command lines as the local launcher, in pods.

`kubernetes_manifests` renders, for each component, a Deployment (``replicas``, the command line
`check_graph` checks, ``resources`` as requests/limits with ``gpu`` as ``nvidia.com/gpu``) and a
Service (the frontend's HTTP port; a worker's system status port), with readiness and liveness
probes on ``/health`` and ``/live``. A service whose program is a notebook gets an init container
that exports it (the plain ``jupyter nbconvert --to script``) into a volume its container runs
the export from. A shared service written ``local`` becomes a StatefulSet
and a Service (etcd, NATS); one written as a URL is used as it is. No cluster is contacted.

Every component requires the cluster secret (`dynamo_nb.runtime.security`): its container reads
``DYN_NB_CLUSTER_SECRET`` from the Secret ``<graph>-cluster-secret`` (key ``secret``), which
you create once (`secret_command`), so a pod that can reach a worker's port still cannot make
it generate without the secret. ``cluster_secret=False`` leaves it out and sets
``DYN_NB_ALLOW_UNAUTHENTICATED=1`` instead (a component refuses to listen off loopback with
neither).

In a pod, a component listens on the pod's address: ``--tcp-host`` and ``--bootstrap-host`` are
the pod IP (``$(POD_IP)``, from the downward API), the frontend's ``--http-host`` and a worker's
``--system-host`` are ``0.0.0.0``, and a worker serves ``/health`` at ``--system-port 9090``.

Example::

    python -m dynamo_nb serve graphs/disagg_hf.yaml --emit k8s --image registry.example/dynamo-nb:0.1 > k8s.yaml
    kubectl apply -f k8s.yaml
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..launch.declarations import split_reference
from ..launch.programs import export_command
from .commands import notebook_of, resources_of, service_argv, service_parser
from .defaults import component_defaults
from .model import Graph, GraphError, Resources, Service

__all__ = ["DEFAULT_IMAGE", "kubernetes_manifests", "manifests_yaml", "secret_command", "secret_name"]

DEFAULT_IMAGE = "dynamo-nb:0.1.0"
SYSTEM_PORT = 9090
ETCD_IMAGE = "gcr.io/etcd-development/etcd:v3.5.21"
NATS_IMAGE = "nats:2.10-alpine"
POD_IP = "$(POD_IP)"
EXPORT_DIR = "/exported"  # where a notebook service's init container writes its export


def kubernetes_manifests(
    graph: Graph,
    *,
    image: str = DEFAULT_IMAGE,
    namespace: str | None = None,
    workdir: str = "/app",
    cwd: Path | None = None,
    cluster_secret: bool = True,
) -> list[dict[str, Any]]:
    """The graph as Kubernetes objects (plain dicts, ``apiVersion``/``kind``/``metadata``/``spec``).

    ``image`` holds this package and the graph's components under ``workdir`` (a component
    path such as ``components/hf_worker.py`` is relative to it). With ``cluster_secret`` every
    component requires the secret in the Secret `secret_name` names (create it with
    `secret_command`).

    Example:
        >>> graph = Graph.from_yaml("components: {frontend: {component: components/frontend.py}}")
        >>> [(m["kind"], m["metadata"]["name"]) for m in kubernetes_manifests(graph)]
        [('StatefulSet', 'graph-etcd'), ('Service', 'graph-etcd'), ('Deployment', 'graph-frontend'), ('Service', 'graph-frontend')]
    """
    cwd = cwd or Path.cwd()
    prefix = _dns_name(graph.name, "name")
    shared = graph.shared or {"etcd": "local"}  # components always need discovery in a cluster
    manifests: list[dict[str, Any]] = []
    urls: dict[str, str] = {}
    for kind, value in shared.items():
        if value == "local":
            manifests += _shared_service(kind, prefix, namespace)
            urls[kind] = f"{kind}://{prefix}-{kind}:{_SHARED[kind]['port']}"
        else:
            urls[kind] = value
    secret = secret_name(graph) if cluster_secret else None
    servers = [name for name, service in graph.services.items() if service.server is not None]
    if servers:
        raise GraphError(
            f"components.{servers[0]}: a server the graph starts with its own command is not rendered for "
            "Kubernetes: run it as its own Deployment from its engine's image, and point the upstream "
            "worker's --upstream at that Deployment's Service"
        )
    for name in graph.start_order():
        manifests += _component(graph.services[name], prefix, urls, image, namespace, workdir, cwd, secret)
    return manifests


def secret_name(graph: Graph) -> str:
    """The Secret holding the graph's cluster secret (key ``secret``).

    Example:
        >>> secret_name(Graph.from_yaml("{name: disagg, components: {fe: {component: components/frontend.py}}}"))
        'disagg-cluster-secret'
    """
    return f"{_dns_name(graph.name, 'name')}-cluster-secret"


def secret_command(graph: Graph, namespace: str | None = None) -> str:
    """The command that creates the graph's cluster secret (once, before ``kubectl apply``).

    Example:
        >>> secret_command(Graph.from_yaml("{name: disagg, components: {fe: {component: components/frontend.py}}}"))
        'kubectl create secret generic disagg-cluster-secret --from-literal=secret="$(openssl rand -hex 32)"'
    """
    where = f" --namespace {namespace}" if namespace else ""
    return f'kubectl create secret generic {secret_name(graph)}{where} --from-literal=secret="$(openssl rand -hex 32)"'


def _secret_env(secret: str) -> dict[str, Any]:
    return {
        "name": "DYN_NB_CLUSTER_SECRET",
        "valueFrom": {"secretKeyRef": {"name": secret, "key": "secret"}},
    }


def manifests_yaml(manifests: list[dict[str, Any]]) -> str:
    """Manifests as one multi-document YAML text (``kubectl apply -f`` reads it)."""
    import yaml

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(manifests, Dumper=_NoAliases, sort_keys=False)


_SHARED: dict[str, dict[str, Any]] = {
    "etcd": {
        "port": 2379,
        "image": ETCD_IMAGE,
        "command": [
            "etcd",
            "--listen-client-urls=http://0.0.0.0:2379",
            "--advertise-client-urls=http://$(POD_IP):2379",
            "--data-dir=/var/lib/etcd",
        ],
        "probe": {"tcpSocket": {"port": 2379}},
    },
    "nats": {
        "port": 4222,
        "image": NATS_IMAGE,
        "command": ["nats-server", "--port=4222", "--http_port=8222"],
        "probe": {"httpGet": {"path": "/healthz", "port": 8222}},
    },
}


def _shared_service(kind: str, prefix: str, namespace: str | None) -> list[dict[str, Any]]:
    spec = _SHARED[kind]
    name = f"{prefix}-{kind}"
    labels = {"app.kubernetes.io/name": kind, "app.kubernetes.io/part-of": prefix}
    container = {
        "name": kind,
        "image": spec["image"],
        "command": spec["command"],
        "env": [_pod_ip_env()],
        "ports": [{"name": "client", "containerPort": spec["port"]}],
        "readinessProbe": {**spec["probe"], "periodSeconds": 5},
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(name, labels, namespace),
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }
    return [stateful_set, _service(name, labels, namespace, "client", spec["port"])]


def _component(
    service: Service,
    prefix: str,
    urls: dict[str, str],
    image: str,
    namespace: str | None,
    workdir: str,
    cwd: Path,
    secret: str | None,
) -> list[dict[str, Any]]:
    extra = {
        "--tcp-host": POD_IP,
        "--bootstrap-host": POD_IP,
        "--http-host": "0.0.0.0",
        "--system-host": "0.0.0.0",
        "--system-port": str(SYSTEM_PORT),
    }
    program, argv = service_argv(service, urls, cwd, extra)
    values = service_parser(service, program).parse_args(argv)
    http_port = getattr(values, "http_port", None)
    if http_port is not None:  # a frontend: probes and its Service on the HTTP port
        port_name, port = "http", http_port or 8000
        if http_port == 0:
            argv = [*argv, "--http-port", str(port)]
    elif getattr(values, "system_port", -1) >= 0:
        port_name, port = "system", values.system_port or SYSTEM_PORT
    else:
        raise GraphError(
            f"components.{service.name}: {service.component} has neither --http-port nor --system-port, "
            "so Kubernetes cannot probe it"
        )
    name = f"{prefix}-{_dns_name(service.name, f'components.{service.name}')}"
    labels = {"app.kubernetes.io/name": service.name, "app.kubernetes.io/part-of": prefix}
    declared = component_defaults(program)
    if declared.name:  # the component's own name, as its file declares it
        labels["app.kubernetes.io/component"] = _dns_name(
            declared.name, f"{service.component}: DEPLOYMENT.name"
        )
    env = component_env(service, secret)
    written, _ = split_reference(service.component)  # FILE of FILE:NAME: the file in the image
    container: dict[str, Any] = {
        "name": _dns_name(service.name, f"components.{service.name}"),
        "image": image,
        "workingDir": workdir,
        "command": ["python3", _program_in_image(written, program, cwd)],
        "args": argv,
        "env": env,
        "ports": [{"name": port_name, "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port_name}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/live", "port": port_name},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
    }
    pod = pod_running(container, service, program, image, workdir, cwd)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, labels, namespace),
        "spec": {
            "replicas": service.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **pod,
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
    }
    return [deployment, _service(name, labels, namespace, port_name, port)]


def component_env(service: Service, secret: str | None) -> list[dict[str, Any]]:
    """A component container's environment: the pod's IP, the cluster secret (or, without one,
    the explicit opt-out: a pod listening on its address would refuse to start with neither) and
    the service's own ``env``."""
    return [
        _pod_ip_env(),
        _secret_env(secret) if secret is not None else {"name": "DYN_NB_ALLOW_UNAUTHENTICATED", "value": "1"},
        *service_env(service),
    ]


def service_env(service: Service) -> list[dict[str, Any]]:
    """The service's own ``env`` as a container's environment entries."""
    return [{"name": key, "value": str(value)} for key, value in service.env.items()]


def pod_running(
    container: dict[str, Any], service: Service, program: Path, image: str, workdir: str, cwd: Path
) -> dict[str, Any]:
    """The pod spec that runs a component's ``container``: its ``resources`` (``gpu`` as
    ``nvidia.com/gpu``) and, for a notebook service, the init container exporting it."""
    resources = _resources(resources_of(service, program))
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {"containers": [container]}
    notebook = notebook_of(service, cwd)
    if notebook is not None:  # an init container exports the notebook; the container runs the export
        written, _ = split_reference(service.component)
        pod |= _exported_notebook(container, _program_in_image(written, notebook, cwd), image, workdir)
    return pod


def _exported_notebook(container: dict[str, Any], notebook: str, image: str, workdir: str) -> dict[str, Any]:
    """The pod parts that run a notebook's export: an init container running the plain
    ``jupyter nbconvert --to script`` into a shared ``emptyDir``, whose program ``container`` runs."""
    mount = {"name": "exported", "mountPath": EXPORT_DIR}
    container["command"] = ["python3", f"{EXPORT_DIR}/{Path(notebook).stem}.py"]
    container["volumeMounts"] = [mount]
    export = {
        "name": "export",
        "image": image,
        "workingDir": workdir,
        "command": ["python3", "-m", *export_command(Path(notebook), Path(EXPORT_DIR))],
        "volumeMounts": [mount],
    }
    return {"initContainers": [export], "volumes": [{"name": "exported", "emptyDir": {}}]}


def _resources(resources: Resources) -> dict[str, dict[str, Any]]:
    amounts: dict[str, Any] = {}
    if resources.cpu:
        amounts["cpu"] = str(resources.cpu)
    if resources.memory:
        amounts["memory"] = str(resources.memory)
    if resources.gpu:
        amounts["nvidia.com/gpu"] = resources.gpu
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _program_in_image(written: str, program: Path, cwd: Path) -> str:
    if not Path(written).is_absolute():
        return Path(written).as_posix()
    try:
        return program.relative_to(cwd).as_posix()
    except ValueError:
        return program.as_posix()


def _service(
    name: str, labels: dict[str, str], namespace: str | None, port_name: str, port: int
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, labels, namespace),
        "spec": {"selector": labels, "ports": [{"name": port_name, "port": port, "targetPort": port_name}]},
    }


def _metadata(name: str, labels: dict[str, str], namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    return metadata


def _pod_ip_env() -> dict[str, Any]:
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _dns_name(name: str, where: str) -> str:
    """``name`` as a Kubernetes object name (lower case, ``-`` for ``_``), or a `GraphError`."""
    text = name.lower().replace("_", "-")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", text) or len(text) > 40:
        raise GraphError(
            f"{where} {name!r} cannot name a Kubernetes object: use letters, digits and '-' (at most 40)"
        )
    return text
