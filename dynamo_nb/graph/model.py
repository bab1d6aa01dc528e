"""A serving graph: named services, each a component program with replicas, flags and resources.

A graph is plain data, built in Python or loaded from YAML (the same object either way)::

    name: disagg-hf
    services: {etcd: local}          # shared services: "local" starts them (LocalServices)
    components:
      prefill:
        component: components/hf_worker.py
        replicas: 2
        flags: {mode: prefill}       # exactly the component's --flags (dashes or underscores)
      decode:
        component: components/hf_worker.py
        flags: {mode: decode}
      frontend:
        component: components/frontend.py
        flags: {http-port: 8000}
        depends_on: [prefill, decode]

A service may also be a **server that is not one of the kit's programs** (a stock ``vllm
serve``): ``server`` is its command line (``python`` is this Python) and ``ready`` the URL that
answers 200 once it serves; an upstream worker (``components/upstream_worker.py``) in front of
it depends on it::

      vllm:
        server: [python, -m, vllm.entrypoints.openai.api_server, --model, MODEL_DIR, --port, "8001"]
        ready: http://127.0.0.1:8001/v1/models
      upstream:
        component: components/upstream_worker.py
        flags: {upstream: "http://127.0.0.1:8001"}
        depends_on: [vllm]

Example:
    >>> graph = Graph.from_yaml("components: {worker: {component: components/echo_worker.py}}")
    >>> graph.services["worker"].replicas, graph.services["worker"].flags
    (1, {})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["Graph", "GraphError", "Resources", "Service"]

SHARED_SERVICES = ("etcd", "nats")
RESTART_POLICIES = ("no", "on-failure")


class GraphError(ConfigError):
    """A graph that cannot start as written; the message names the service and the key."""


@dataclass
class Resources:
    """What one replica needs: GPUs (assigned explicitly, never oversubscribed), CPU cores, memory."""

    gpu: int = 0
    cpu: float | None = None
    memory: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Resources:
        data = _mapping(data or {}, where)
        unknown = sorted(set(data) - {"gpu", "cpu", "memory"})
        if unknown:
            raise GraphError(f"{where}: unknown key {unknown[0]!r}; use gpu, cpu or memory")
        gpu = data.get("gpu", 0)
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise GraphError(f"{where}.gpu must be a whole number of GPUs (0 or more), got {gpu!r}")
        return cls(gpu=gpu, cpu=data.get("cpu"), memory=data.get("memory"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu}  # written even when 0: it overrides the component's
        out |= {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
        return out


@dataclass
class Service:
    """One component of a graph: ``python <component> <flags>``, ``replicas`` times.

    Attributes:
        component: the program (a path such as ``components/hf_worker.py``, found as `launch` finds it).
        flags: the component's own flags, ``{"mode": "prefill"}`` for ``--mode prefill``; ``True``
            for a switch, a list for a flag given several values.
        resources: what one replica needs; None (not written): what its component's ``DEPLOYMENT``
            declares (`dynamo_nb.graph.defaults`).
        depends_on: services that must be ready before this one starts.
        restart: ``no`` or ``on-failure``.
    """

    name: str
    component: str = ""
    replicas: int = 1
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None
    depends_on: list[str] = field(default_factory=list)
    restart: str = "no"
    server: list[str] | None = None
    ready: str | None = None

    @classmethod
    def from_dict(cls, name: str, data: Any) -> Service:
        where = f"components.{name}"
        data = _mapping(data, where)
        known = {
            "component",
            "server",
            "ready",
            "replicas",
            "flags",
            "env",
            "resources",
            "depends_on",
            "restart",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise GraphError(f"{where}: unknown key {unknown[0]!r}; use {', '.join(sorted(known))}")
        server = _server_of(data, where)
        if server is None and not isinstance(data.get("component"), str):
            raise GraphError(
                f"{where}.component must name the program, e.g. components/hf_worker.py (or give server: "
                "and ready: for a server that is not one of the kit's programs)"
            )
        replicas = data.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise GraphError(f"{where}.replicas must be a whole number (0 or more), got {replicas!r}")
        if server is not None and replicas > 1:
            raise GraphError(
                f"{where}.replicas: a server listens on the port its command names, so it runs once; "
                "write one service per server"
            )
        restart = data.get("restart", "no")
        if restart not in RESTART_POLICIES:
            raise GraphError(f"{where}.restart must be one of {', '.join(RESTART_POLICIES)}, got {restart!r}")
        depends = data.get("depends_on", [])
        if not isinstance(depends, list) or not all(isinstance(d, str) for d in depends):
            raise GraphError(f"{where}.depends_on must be a list of service names, got {depends!r}")
        return cls(
            name=name,
            component=data.get("component") or "",
            server=server,
            ready=data.get("ready"),
            replicas=replicas,
            flags=dict(_mapping(data.get("flags") or {}, f"{where}.flags")),
            env={str(k): str(v) for k, v in _mapping(data.get("env") or {}, f"{where}.env").items()},
            resources=Resources.from_dict(data["resources"], f"{where}.resources")
            if "resources" in data
            else None,
            depends_on=list(depends),
            restart=restart,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"server": list(self.server), "ready": self.ready}
            if self.server is not None
            else {"component": self.component}
        )
        if self.replicas != 1:
            out["replicas"] = self.replicas
        for key, value in (
            ("flags", self.flags),
            ("env", self.env),
            ("resources", self.resources.to_dict() if self.resources is not None else None),
            ("depends_on", self.depends_on),
        ):
            if value:
                out[key] = value
        if self.restart != "no":
            out["restart"] = self.restart
        return out


def _server_of(data: dict[str, Any], where: str) -> list[str] | None:
    """A server service's command line (None for a component); errors say what to write."""
    if "server" not in data:
        if "ready" in data:
            raise GraphError(f"{where}.ready belongs to a server: give its command line as server: [...]")
        return None
    if "component" in data:
        raise GraphError(
            f"{where}: give component (one of the kit's programs) or server (a command), not both"
        )
    server = data["server"]
    if isinstance(server, str):
        server = server.split()
    if not isinstance(server, list) or not server or not all(isinstance(word, (str, int)) for word in server):
        raise GraphError(
            f"{where}.server must be the server's command line, e.g. [python, -m, vllm.entrypoints.openai.api_server, ...]"
        )
    ready = data.get("ready")
    if not isinstance(ready, str) or not ready.startswith(("http://", "https://")):
        raise GraphError(
            f"{where}.ready must be the URL that answers 200 once the server serves, e.g. "
            f"http://127.0.0.1:8001/v1/models, got {ready!r}"
        )
    if data.get("flags"):
        raise GraphError(f"{where}.flags: a server's flags are part of its command line (server: [...])")
    return [str(word) for word in server]


@dataclass
class Graph:
    """Named services and the shared services they use (see the module docstring)."""

    name: str = "graph"
    services: dict[str, Service] = field(default_factory=dict)
    shared: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> Graph:
        data = _mapping(data, "the graph")
        unknown = sorted(set(data) - {"name", "services", "components"})
        if unknown:
            raise GraphError(f"unknown top-level key {unknown[0]!r}; use name, services, components")
        shared = {str(k): str(v) for k, v in _mapping(data.get("services") or {}, "services").items()}
        for key, value in shared.items():
            if key not in SHARED_SERVICES:
                raise GraphError(
                    f"services: unknown shared service {key!r}; use {', '.join(SHARED_SERVICES)}"
                )
            if value != "local" and "://" not in value:
                raise GraphError(
                    f"services.{key} must be 'local' or a URL such as {key}://HOST:PORT, got {value!r}"
                )
        components = _mapping(data.get("components") or {}, "components")
        if not components:
            raise GraphError("the graph has no components: add at least one under components:")
        graph = cls(
            name=str(data.get("name", "graph")),
            services={str(n): Service.from_dict(str(n), s) for n, s in components.items()},
            shared=shared,
        )
        graph.start_order()  # unknown or circular dependencies fail here
        return graph

    @classmethod
    def from_yaml(cls, source: str | Path) -> Graph:
        """A graph from YAML text or a ``.yaml`` file's path; a relative path is found as `launch`
        finds components (the working folder and its parents, then the dynamo_nb checkout), so
        ``Graph.from_yaml("graphs/agg_hf.yaml")`` works from ``notebooks/`` too."""
        import yaml

        if isinstance(source, Path) or str(source).endswith((".yaml", ".yml")):
            from ..launch.paths import resolve_program

            text = resolve_program(str(source), Path.cwd()).read_text()
        else:
            text = source
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise GraphError(f"the graph file is not valid YAML: {exc}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.shared:
            out["services"] = dict(self.shared)
        out["components"] = {name: service.to_dict() for name, service in self.services.items()}
        return out

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def start_order(self) -> list[str]:
        """Service names, each after those it depends on (file order otherwise)."""
        order: list[str] = []
        visiting: set[str] = set()

        def visit(name: str, path: list[str]) -> None:
            if name in order:
                return
            if name in visiting:
                raise GraphError(f"components: circular depends_on: {' -> '.join([*path, name])}")
            visiting.add(name)
            for dependency in self.services[name].depends_on:
                if dependency not in self.services:
                    raise GraphError(
                        f"components.{name}.depends_on names {dependency!r}, which is not a component; "
                        f"use one of {', '.join(self.services)}"
                    )
                visit(dependency, [*path, name])
            visiting.discard(name)
            order.append(name)

        for name in self.services:
            visit(name, [])
        return order

    def start_waves(self) -> list[list[str]]:
        """Service names in waves: each wave's services depend only on earlier waves, so a wave
        starts at once (a service with no ``depends_on`` is in the first).

        Example:
            >>> graph = Graph.from_yaml(
            ...     "components: {a: {component: x.py}, b: {component: y.py}, c: {component: z.py, depends_on: [a, b]}}"
            ... )
            >>> graph.start_waves()
            [['a', 'b'], ['c']]
        """
        depth: dict[str, int] = {}
        for name in self.start_order():
            depth[name] = 1 + max((depth[d] for d in self.services[name].depends_on), default=-1)
        waves: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for name, level in depth.items():
            waves[level].append(name)
        return waves


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise GraphError(f"{where} must be a mapping of keys to values, got {type(data).__name__}")
    return data
