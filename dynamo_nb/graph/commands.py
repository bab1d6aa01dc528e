"""A graph's command lines, checked with each component's own parser before anything starts.

A service's ``flags`` are exactly its component's ``--flags`` (``http_port`` or ``http-port``).
`check_graph` builds every command line and parses it with the component's ``build_parser()``
(loaded from its file, not run), so an unknown flag, a wrong type or a bad choice is a
`GraphError` naming the service, the flag and what is allowed, before any process starts.

Example:
    >>> flag_argv({"mode": "prefill", "http_port": 8000, "static": True, "debug": False})
    ['--mode', 'prefill', '--http-port', '8000', '--static']
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..extras import extra_installed
from ..launch.declarations import split_reference
from ..launch.paths import resolve_program
from ..launch.programs import export_command, import_program, reference_program
from ..notebook.component_program import find_component
from .defaults import component_defaults
from .model import Graph, GraphError, Resources, Service

__all__ = [
    "ReplicaCommand",
    "apply_overrides",
    "check_graph",
    "dry_run",
    "flag_argv",
    "notebook_of",
    "service_argv",
    "service_parser",
]

_PARSERS: dict[tuple[Path, str | None], argparse.ArgumentParser] = {}


@dataclass
class ReplicaCommand:
    """One replica's program, flags and extra environment (its GPUs, when it asks for some)."""

    service: str
    index: int
    program: Path
    argv: list[str]
    env: dict[str, str]
    notebook: Path | None = None  # the notebook ``program`` is the export of
    ready: str | None = None  # a server's: the URL that answers once it serves (it prints no READY line)

    @property
    def name(self) -> str:
        """``service`` for a single replica, else ``service-<index>``."""
        return self.service if self.index < 0 else f"{self.service}-{self.index}"

    def shell(self) -> str:
        """The command line, as `--dry-run` prints it, ready to paste (the program relative to the
        working folder when it is inside it, else absolute: a notebook's export in the cache)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        if self.ready is not None:  # a server's own command line
            shown = "python3" if str(self.program) == sys.executable else str(self.program)
            line = shlex.join([shown, *self.argv])
        else:
            line = shlex.join(["python3", shown_path(self.program), *self.argv])
        return f"{env} {line}" if env else line

    def export_step(self) -> str | None:
        """The nbconvert command that makes ``program`` from its notebook (None: not a notebook)."""
        import shlex

        if self.notebook is None:
            return None
        return shlex.join(export_command(Path(shown_path(self.notebook)), self.program.parent))


def shown_path(path: Path) -> str:
    """``path`` as a command line shows it: relative to the working folder when inside it or one
    level up (``../components/x.py`` from ``notebooks/``), else absolute (never ``../../..`` into
    a cache folder, which breaks when pasted elsewhere).

    Example:
        >>> shown_path(Path.cwd() / "components" / "frontend.py"), shown_path(Path("/opt/x.py"))
        ('components/frontend.py', '/opt/x.py')
    """
    relative = os.path.relpath(path)
    climbs_twice = Path(relative).parts[:2] == (os.pardir, os.pardir)
    return str(Path(path).resolve()) if climbs_twice else relative


def flag_argv(flags: dict[str, Any]) -> list[str]:
    """``--flag value`` pairs for a service's ``flags`` (``True``: a switch; ``False``/None: left out;
    a list: several values; a mapping: JSON)."""
    argv: list[str] = []
    for key, value in flags.items():
        option = "--" + str(key).replace("_", "-")
        if value is True:
            argv.append(option)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            argv += [option, *(str(v) for v in value)]
        elif isinstance(value, dict):
            argv += [option, json.dumps(value)]
        else:
            argv += [option, str(value)]
    return argv


def apply_overrides(graph: Graph, overrides: list[str]) -> None:
    """``service.flag=value`` (``--set frontend.http-port=8001``) into the graph's flags; values are YAML."""
    import yaml

    for override in overrides:
        target, sep, raw = override.partition("=")
        service, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise GraphError(f"--set {override!r}: write SERVICE.FLAG=VALUE, e.g. frontend.http-port=8001")
        if service not in graph.services:
            raise GraphError(
                f"--set {override!r}: no component {service!r}; use one of {', '.join(graph.services)}"
            )
        if key == "replicas":
            graph.services[service].replicas = int(raw)
        else:
            graph.services[service].flags[key] = yaml.safe_load(raw)


def component_parser(
    program: Path, *, where: str | None = None, name: str | None = None
) -> argparse.ArgumentParser:
    """The component's own parser, from its file loaded without running ``main``: its
    ``build_parser()``, else the parser of the worker it declares (``name``, else its one worker:
    `dynamo_nb.notebook.component_program`, e.g. a notebook's export). Errors name ``where`` (the
    notebook a graph names, not its export)."""
    if (program, name) not in _PARSERS:
        where = where or str(program)
        try:
            module = import_program(program, where)
            if hasattr(module, "build_parser") and name is None:
                _PARSERS[program, name] = module.build_parser()
            else:
                _PARSERS[program, name] = find_component(
                    vars(module), where, runnable=True, name=name
                ).build_parser()
        except GraphError:
            raise
        except ConfigError as exc:
            raise GraphError(str(exc)) from None
    return _PARSERS[program, name]


def _check(service: Service, program: Path, argv: list[str]) -> None:
    parser = service_parser(service, program)
    options = {option: action for action in parser._actions for option in action.option_strings}
    where = f"components.{service.name}.flags"
    for key in service.flags:
        option = "--" + str(key).replace("_", "-")
        if option not in options:
            close = difflib.get_close_matches(option, list(options), n=3)
            hint = (
                f"; did you mean {', '.join(close)}?"
                if close
                else f"; see python3 {shown_path(program)} --help"
            )
            raise GraphError(f"{where}: {key!r} is not a flag of {service.component}{hint}")
        action = options[option]
        if action.nargs == 0 and service.flags[key] not in (True, False, None):
            raise GraphError(f"{where}.{key} is a switch: write true or false, got {service.flags[key]!r}")

    def refuse(message: str) -> None:
        raise GraphError(f"{where}: {message} (component {service.component})")

    original = parser.error
    parser.error = refuse  # type: ignore[method-assign,assignment]  # argparse's documented way to keep it from exiting
    try:
        parser.parse_args(argv)
    finally:
        parser.error = original  # type: ignore[method-assign]  # restores argparse's own


def check_graph(
    graph: Graph,
    *,
    urls: dict[str, str] | None = None,
    gpus: list[str] | None = None,
    cwd: Path | None = None,
    stand_ins: bool = False,
) -> list[ReplicaCommand]:
    """Every replica's command line, in start order, each checked with its component's parser.

    ``urls`` are the shared services' URLs (``{"etcd": "etcd://…", "nats": "nats://…"}``): a
    component that takes ``--discovery`` / ``--nats-url`` and does not set it gets them.
    ``gpus`` are the devices to hand out (default: ``CUDA_VISIBLE_DEVICES``, else the host's); a
    replica asking ``resources.gpu: N`` gets N of them as its ``CUDA_VISIBLE_DEVICES``, and a
    graph asking for more than there are is refused — or, with ``stand_ins``, handed ``<gpu N>``
    for each device the host lacks (a plan to look at, not to run).
    """
    cwd = cwd or Path.cwd()
    urls = urls or {}
    free = list(gpus if gpus is not None else visible_gpus())
    lines = {name: service_argv(graph.services[name], urls, cwd) for name in graph.start_order()}
    per_replica = {
        name: resources_of(graph.services[name], program).gpu for name, (program, _) in lines.items()
    }
    wanted = sum(per_replica[name] * graph.services[name].replicas for name in lines)
    if wanted > len(free) and stand_ins:
        free += [f"<gpu {index}>" for index in range(len(free), wanted)]
    if wanted > len(free):
        raise GraphError(
            f"the graph asks for {wanted} GPU(s) (resources.gpu × replicas), this host has {len(free)}; "
            f"per replica: {', '.join(f'{n} {g}' for n, g in per_replica.items() if g)} (a service without "
            "resources gets its component's DEPLOYMENT resources; write resources: {gpu: 0} to run without)"
        )
    commands: list[ReplicaCommand] = []
    for name, (program, argv) in lines.items():
        service = graph.services[name]
        for index in range(service.replicas):
            env = dict(service.env)
            if per_replica[name]:
                taken, free = free[: per_replica[name]], free[per_replica[name] :]
                env["CUDA_VISIBLE_DEVICES"] = ",".join(taken)
            commands.append(
                ReplicaCommand(
                    name,
                    index if service.replicas > 1 else -1,
                    program,
                    argv,
                    env,
                    notebook_of(service, cwd),
                    ready=service.ready,
                )
            )
    return commands


def dry_run(graph: Graph, *, gpus: list[str] | None = None, cwd: Path | None = None) -> str:
    """What ``python -m dynamo_nb serve graph.yaml --dry-run`` prints: every replica's checked
    command line (``name: command``), a notebook service's export step before its first replica;
    the shared services stand as ``<local etcd>``/``<local nats>``. It plans on any host: what this
    one lacks to run it — GPUs (``gpus``, default: the visible ones; a missing device stands as
    ``<gpu N>``) or a package a component needs (its ``DEPLOYMENT["needs"]``: vLLM, SGLang …) —
    comes first as ``# this host lacks …`` lines (a real start refuses). Raises `GraphError`
    (what to change) where a flag or a component does not fit.

    Example::

        graph = Graph.from_yaml("graphs/disagg_vllm_gpu.yaml")
        apply_overrides(graph, ["prefill.model-path=/models/Qwen3-0.6B", "decode.model-path=/models/Qwen3-0.6B"])
        print(dry_run(graph))   # on a laptop: "# this host lacks 2 GPU(s) …", then the commands
    """
    urls = {
        name: (url if url != "local" else f"{name}://<local {name}>") for name, url in graph.shared.items()
    }
    host_gpus = list(gpus if gpus is not None else visible_gpus())
    commands = check_graph(graph, urls=urls, gpus=host_gpus, cwd=cwd, stand_ins=True)
    lines = _host_lacks(graph, commands, len(host_gpus))
    exported = set()
    for command in commands:
        step = command.export_step()
        if step is not None and step not in exported:  # a notebook service: its export first
            exported.add(step)
            lines.append(f"{command.service} (export): {step}")
        lines.append(f"{command.name}: {command.shell()}")
    return "\n".join(lines)


def _host_lacks(graph: Graph, commands: list[ReplicaCommand], host_gpus: int) -> list[str]:
    """``# this host lacks …`` lines: the GPUs the graph asks for beyond ``host_gpus`` and each
    package a service's component needs that is not installed here (none: this host can run it)."""
    asked = sum(
        len(c.env["CUDA_VISIBLE_DEVICES"].split(",")) for c in commands if "CUDA_VISIBLE_DEVICES" in c.env
    )
    lacks = []
    if asked > host_gpus:
        lacks.append(f"# this host lacks {asked - host_gpus} GPU(s): the graph asks for {asked}, it has {host_gpus} "
                     "(<gpu N> stands for each missing device; a real start refuses)")  # fmt: skip
    missing: dict[str, list[str]] = {}
    for name in graph.start_order():
        service = graph.services[name]
        if service.server is not None:
            continue
        program = next(c.program for c in commands if c.service == name)
        for module in component_defaults(program).needs:
            if not extra_installed(module):
                missing.setdefault(module, []).append(name)
    for module, services in missing.items():
        lacks.append(
            f"# this host lacks {module} (for {', '.join(services)}): not installed here; a real start refuses"
        )
    return lacks


def resources_of(service: Service, program: Path) -> Resources:
    """The service's ``resources``, or its component's declared ``DEPLOYMENT`` resources when it names none."""
    if service.resources is not None:
        return service.resources
    if service.server is not None:  # not one of the kit's programs: nothing declared
        return Resources()
    return component_defaults(program).resources


def service_argv(
    service: Service, urls: dict[str, str], cwd: Path, extra: dict[str, str] | None = None
) -> tuple[Path, list[str]]:
    """``(program, argv)`` of one service, checked with its component's parser.

    The shared services' ``urls`` become ``--discovery`` / ``--nats-url`` and ``extra`` flags
    (``{"--tcp-host": "0.0.0.0"}``) are added, each only where the component has the flag and the
    service does not set it.
    """
    if service.server is not None:  # a server's command runs as written (``python``: this Python)
        first, *rest = service.server
        return Path(sys.executable if first in ("python", "python3") else first), rest
    try:  # a notebook runs as its export, checked for its one worker declaration (or the one named)
        program = reference_program(service.component, cwd)
    except ConfigError as exc:
        raise GraphError(f"components.{service.name}.component: {exc}") from None
    argv = flag_argv(service.flags)
    options = {
        option for action in service_parser(service, program)._actions for option in action.option_strings
    }
    given = {"--" + str(k).replace("_", "-") for k in service.flags}
    added = {
        flag: urls[key] for flag, key in (("--discovery", "etcd"), ("--nats-url", "nats")) if key in urls
    }
    for flag, value in {**added, **(extra or {})}.items():
        if flag in options and flag not in given:
            argv += [flag, value]
    _check(service, program, argv)
    return program, argv


def notebook_of(service: Service, cwd: Path) -> Path | None:
    """The notebook a service names (its program is the notebook's export), else None."""
    if service.server is not None:
        return None
    file, _ = split_reference(service.component)
    return resolve_program(file, cwd) if file.endswith(".ipynb") else None


def service_parser(service: Service, program: Path) -> argparse.ArgumentParser:
    """The parser of the component a service names (``FILE`` or ``FILE:NAME``), whose program is
    ``program`` (a notebook's export); errors name the service's file."""
    file, name = split_reference(service.component)
    return component_parser(program, where=file, name=name)


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out: ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi -L``'s."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in listed.split(",") if g.strip()]
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        lines = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(lines.splitlines()) if line.startswith("GPU ")]
