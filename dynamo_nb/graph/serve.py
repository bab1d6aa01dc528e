"""Start a graph: its shared services, then every replica in dependency order, each checked first.

``await serve(graph)`` (a notebook) and ``python -m dynamo_nb serve graph.yaml`` (a terminal)
do the same: check every command line with its component's parser (nothing starts if one is
wrong), start ``services: {etcd: local, nats: local}`` as `LocalServices`, launch each service's
replicas with `dynamo_nb.launch` (its READY line is its readiness) once the services it
depends on are ready (those that wait for nothing more start together), restart replicas whose
service says ``restart: on-failure`` when they die (up to 5 times, with backoff), and stop it
all, replicas in reverse order then the services, on `RunningGraph.stop`.

Example::

    running = await serve(Graph.from_yaml(Path("graphs/agg_hf.yaml")))
    print(running.status())          # [{'replica': 'worker', 'pid': 1234, 'state': 'running', ...}]
    await running.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ProcessStartError
from ..launch import LocalServices, launch, launch_server
from ..launch.launcher import ManagedProcess
from .commands import ReplicaCommand, check_graph, resources_of, service_argv, visible_gpus
from .model import Graph, GraphError

__all__ = ["RunningGraph", "serve"]

logger = logging.getLogger("dynamo_nb.graph")

MAX_RESTARTS = 5


@dataclass
class _Replica:
    command: ReplicaCommand
    process: ManagedProcess | None = None
    restarts: int = 0
    watcher: asyncio.Task[None] | None = None


@dataclass
class RunningGraph:
    """A started graph: its replicas (by name), its `LocalServices` (None when it uses others)."""

    graph: Graph
    services: LocalServices | None
    replicas: dict[str, _Replica] = field(default_factory=dict)
    _urls: dict[str, str] = field(default_factory=dict)
    _cwd: Path | None = None
    _show_logs: bool = True
    _timeout: float = 300.0
    _stopping: bool = False

    def process(self, name: str) -> ManagedProcess:
        """The live process of replica ``name`` (``frontend``, ``prefill-0``, …)."""
        replica = self.replicas[name]
        if replica.process is None:
            raise KeyError(f"replica {name} has no process")
        return replica.process

    @property
    def url(self) -> str | None:
        """The first replica that serves HTTP (a frontend): its URL (a server the graph names is not one)."""
        for replica in self.replicas.values():
            if replica.command.ready is not None:
                continue
            url = getattr(replica.process, "url", None)
            if url:
                return url
        return None

    def status(self) -> list[dict[str, Any]]:
        """One row per replica: its name, service, pid, state and restarts."""
        rows = []
        for name, replica in self.replicas.items():
            process = replica.process
            state = "running" if process is not None and process.running else "exited"
            rows.append(
                {
                    "replica": name,
                    "service": replica.command.service,
                    "pid": process.pid if process is not None else None,
                    "state": state,
                    "returncode": None if process is None else process.returncode,
                    "restarts": replica.restarts,
                }
            )
        return rows

    async def wait_running(self, timeout: float = 60.0) -> None:
        """Wait until every replica runs (a crashed one that its ``restart`` policy brings back
        counts once it is ready again); `ProcessStartError` names those still down at ``timeout``.

        Example::

            running.process("worker").send_signal(signal.SIGKILL)
            await running.wait_running(timeout=60)  # restarted: restart: on-failure
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            down = [row["replica"] for row in self.status() if row["state"] != "running"]
            if not down:
                return
            if loop.time() >= deadline:
                raise ProcessStartError(
                    f"{', '.join(down)} not running after {timeout:g} s (a service restarts only with "
                    "restart: on-failure, at most 5 times; see its log)"
                )
            await asyncio.sleep(0.1)

    async def scale(self, service: str, replicas: int) -> None:
        """Run ``replicas`` copies of ``service`` now: start the missing ones (ready when this
        returns), or stop the last started. Discovery lets frontends and routers follow.

        Example::

            await running.scale("prefill", 2)     # prefill, prefill-1
            await running.scale("prefill", 1)     # prefill-1 stopped
        """
        if service not in self.graph.services:
            raise GraphError(f"no component {service!r}; use one of {', '.join(self.graph.services)}")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise GraphError(f"replicas must be a whole number (0 or more), got {replicas!r}")
        if self.graph.services[service].server is not None and replicas > 1:
            raise GraphError(f"{service} is a server listening on the port its command names: it runs once")
        current = [r for r in self.replicas.values() if r.command.service == service]
        template = current[0].command if current else None
        if template is None and replicas:  # scaled to 0 before: its command line again, checked
            spec = self.graph.services[service]
            program, argv = service_argv(spec, self._urls, self._cwd or Path.cwd())
            template = ReplicaCommand(service, -1, program, argv, dict(spec.env), ready=spec.ready)
        for replica in reversed(current[replicas:]):
            await self._stop_replica(replica, timeout=10.0)
            del self.replicas[replica.command.name]
        if template is None or replicas <= len(current):
            self.graph.services[service].replicas = replicas
            return
        taken = {r.command.index for r in current}
        first = 1 if -1 in taken else 0
        free = self._free_gpus()
        gpus = resources_of(self.graph.services[service], template.program).gpu
        if gpus * (replicas - len(current)) > len(free):
            raise GraphError(
                f"{service} needs {gpus} GPU(s) per replica; {len(free)} are free for {replicas - len(current)} more"
            )
        fresh = []
        for _ in range(replicas - len(current)):
            index = next(i for i in range(first, replicas + len(taken) + 1) if i not in taken)
            taken.add(index)
            env = dict(template.env)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"], free = ",".join(free[:gpus]), free[gpus:]
            command = ReplicaCommand(service, index, template.program, template.argv, env)
            fresh.append(_Replica(command))
            self.replicas[command.name] = fresh[-1]
        started = await asyncio.gather(
            *(self._start(r, show_logs=self._show_logs, timeout=self._timeout) for r in fresh),
            return_exceptions=True,
        )
        failed = [result for result in started if isinstance(result, BaseException)]
        for replica, result in zip(fresh, started, strict=True):
            if isinstance(result, BaseException):
                del self.replicas[replica.command.name]
        self.graph.services[service].replicas = len(
            [r for r in self.replicas.values() if r.command.service == service]
        )
        if failed:
            raise failed[0]

    def _free_gpus(self) -> list[str]:
        used = {
            gpu
            for replica in self.replicas.values()
            for gpu in replica.command.env.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if gpu
        }
        return [gpu for gpu in visible_gpus() if gpu not in used]

    async def _stop_replica(self, replica: _Replica, timeout: float) -> None:
        if replica.watcher is not None:
            replica.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replica.watcher
        if replica.process is not None:
            await replica.process.stop(timeout=timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop every replica (the last started first), then the shared services."""
        self._stopping = True
        for replica in reversed(list(self.replicas.values())):
            await self._stop_replica(replica, timeout=timeout)
        if self.services is not None:
            await self.services.stop()

    async def _start(self, replica: _Replica, *, show_logs: bool, timeout: float) -> None:
        command = replica.command
        replica.process = await _launch(command, show_logs=show_logs, timeout=timeout)
        if self.graph.services[command.service].restart == "on-failure":
            replica.watcher = asyncio.get_running_loop().create_task(
                self._watch(replica, show_logs=show_logs, timeout=timeout),
                name=f"dynamo_nb graph {command.name}",
            )

    async def _watch(self, replica: _Replica, *, show_logs: bool, timeout: float) -> None:
        """Restart ``replica`` when it exits with an error, up to `MAX_RESTARTS` times, backing off."""
        while replica.process is not None:
            code = await replica.process.wait()
            if self._stopping or code == 0:
                return
            if replica.restarts >= MAX_RESTARTS:
                logger.error(
                    "%s exited with %s %d times: not restarting it again",
                    replica.command.name,
                    code,
                    MAX_RESTARTS,
                )
                return
            delay = min(2.0**replica.restarts, 30.0)
            replica.restarts += 1
            logger.warning(
                "%s exited with %s; restart %d of %d in %.0f s",
                replica.command.name,
                code,
                replica.restarts,
                MAX_RESTARTS,
                delay,
            )
            await asyncio.sleep(delay)
            command = replica.command
            try:
                replica.process = await _launch(command, show_logs=show_logs, timeout=timeout)
            except Exception as exc:  # it failed to start: count it and try again
                logger.warning("%s did not start again: %s", command.name, exc)


async def _launch(command: ReplicaCommand, *, show_logs: bool, timeout: float) -> ManagedProcess:
    """Start one replica: a kit program (ready at its READY line), or a server (ready once its
    ``ready`` URL answers)."""
    options: dict[str, Any] = {"name": command.name, "env": command.env or None, "show_logs": show_logs}
    if command.ready is not None:
        return await launch_server(command.program, *command.argv, url=command.ready, ready_path="",
                                   timeout=timeout, **options)  # fmt: skip
    return await launch(command.program, *command.argv, timeout=timeout, **options)


async def serve(
    graph: Graph,
    *,
    cwd: Path | None = None,
    show_logs: bool = True,
    timeout: float = 300.0,
) -> RunningGraph:
    """Check, then start ``graph`` (see the module docstring); returns the `RunningGraph`.

    Raises `GraphError` before anything starts when a command line is wrong; when a replica
    fails to start, what started is stopped again and its `LaunchError` goes up.
    """
    check_graph(graph, urls={k: f"{k}://placeholder:0" for k in graph.shared}, cwd=cwd)  # nothing runs yet
    local = {k for k, v in graph.shared.items() if v == "local"}
    services = await LocalServices.start(etcd="etcd" in local, nats="nats" in local) if local else None
    urls = {k: v for k, v in graph.shared.items() if v != "local"}
    if services is not None:
        urls |= {k: url for k, url in (("etcd", services.etcd_url), ("nats", services.nats_url)) if url}
    running = RunningGraph(graph, services, _urls=urls, _cwd=cwd, _show_logs=show_logs, _timeout=timeout)
    try:
        commands = check_graph(graph, urls=urls, cwd=cwd)
        for wave in graph.start_waves():  # services that wait for nothing more start together
            batch = [_Replica(c) for c in commands if c.service in wave]
            for replica in batch:
                running.replicas[replica.command.name] = replica
                if replica.command.env.get("CUDA_VISIBLE_DEVICES"):
                    logger.info(
                        "%s gets GPU(s) %s", replica.command.name, replica.command.env["CUDA_VISIBLE_DEVICES"]
                    )
            started = await asyncio.gather(
                *(running._start(r, show_logs=show_logs, timeout=timeout) for r in batch),
                return_exceptions=True,
            )
            failed = [result for result in started if isinstance(result, BaseException)]
            if failed:
                raise failed[0]
    except BaseException:
        await running.stop()
        raise
    return running
