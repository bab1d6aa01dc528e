"""Running a component as a program: its runtime from flags, signals, logging, its READY line.

- `dynamo_worker`: the decorator that gives a script's ``main`` coroutine its runtime;
- `RuntimeConfig` / `runtime_from_args`: the runtime the runtime flags
  (`dynamo_nb.flags.add_runtime_args`) describe, typed, built once in a component's ``main``;
- `shutdown_on_signals`, `run_program`: SIGINT/SIGTERM end it, a `ConfigError` is one line, uvloop
  when installed (`uses_uvloop`);
- `configure_logging`: the one logging setup every component uses;
- `announce_ready` / `parse_ready_line`: the one READY line format,
  ``READY <subject> key=value ...`` — a worker's subject is its endpoint path, a frontend's is
  ``frontend``; `dynamo_nb.launch` waits for it and reads ``instance=`` and ``url=`` from it.

Example:
    >>> ready_line("dynamo.backend.generate", instance="1a2b", address="tcp://127.0.0.1:9", model="tiny")
    'READY dynamo.backend.generate instance=1a2b address=tcp://127.0.0.1:9 model=tiny'
    >>> parse_ready_line("READY frontend url=http://127.0.0.1:8000 models=tiny")
    ('frontend', {'url': 'http://127.0.0.1:8000', 'models': 'tiny'})
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import functools
import gc
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError
from ..jupyter import in_notebook
from ..settings import Settings, setting
from ..telemetry.request_ids import RequestIdFilter
from ..telemetry.tracing import enable_tracing_from_env, flush_tracing
from .discovery import DEFAULT_LEASE_TTL
from .distributed import DistributedRuntime
from .security import PlaneSecurity, configure
from .serving import ServingRuntime
from .system_status import start_system_status

__all__ = [
    "READY",
    "RuntimeConfig",
    "announce_ready",
    "configure_logging",
    "dynamo_worker",
    "kit_runtime_from_args",
    "parse_ready_line",
    "ready_line",
    "run_program",
    "run_tuned",
    "runtime_from_args",
    "shutdown_on_signals",
    "tune_gc_for_serving",
    "uses_uvloop",
]

READY = "READY"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


T = TypeVar("T")


def dynamo_worker(
    func: Callable[..., Awaitable[T]] | None = None,
    *,
    discovery: str | None = None,
    request_plane: str | None = None,
    nats_url: str | None = None,
    handle_signals: bool = True,
    **create_kwargs: Any,
) -> Any:
    """Decorate ``async def main(runtime, ...)``: the runtime is created and passed first.

    Arguments left out come from ``DYN_NB_DISCOVERY``, ``DYN_NB_REQUEST_PLANE`` and
    ``DYN_NB_NATS_URL``, else the `DistributedRuntime.create` defaults. In a script, SIGINT
    and SIGTERM shut the runtime down (so ``serve_endpoint`` returns); the runtime is shut
    down when the function returns or raises.

    Example:
        >>> @dynamo_worker(discovery="memory")
        ... async def main(runtime):
        ...     return runtime.connection_id > 0
        >>> import asyncio; asyncio.run(main())
        True
    """

    def decorate(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            runtime = await DistributedRuntime.create(
                discovery or os.environ.get("DYN_NB_DISCOVERY", "memory"),
                request_plane or os.environ.get("DYN_NB_REQUEST_PLANE") or None,
                nats_url or os.environ.get("DYN_NB_NATS_URL") or None,
                **create_kwargs,
            )
            remove = shutdown_on_signals(runtime) if handle_signals else _nothing
            try:
                return await fn(runtime, *args, **kwargs)
            finally:
                remove()
                await runtime.shutdown()

        return wrapper

    return decorate(func) if func is not None else decorate


def _nothing() -> None:
    return None


def program_name() -> str:
    """This process's program as its log lines name it: the script's stem (``frontend``,
    ``hf_worker``, a notebook export's name), or ``python`` for ``python -c``/an interactive one.

    Example:
        >>> isinstance(program_name(), str)
        True
    """
    path = sys.argv[0] if sys.argv and sys.argv[0] else ""
    stem = os.path.basename(path).removesuffix(".py")
    if stem == "__main__":  # python -m package
        stem = os.path.basename(os.path.dirname(path))
    return stem if stem and stem not in ("-c", "-m") else "python"


def shutdown_on_signals(*runtimes: ServingRuntime) -> Callable[[], None]:
    """Make SIGINT and SIGTERM shut ``runtimes`` down; returns a function that undoes it.

    Pass every runtime of the process in one call (a later call replaces the handlers).
    Does nothing inside a Jupyter kernel or outside the main thread.

    Example::

        remove = shutdown_on_signals(runtime)
        await runtime.wait_closed()             # returns after Ctrl-C or `kill PID`
    """
    if in_notebook() or threading.current_thread() is not threading.main_thread():
        return _nothing
    loop = asyncio.get_running_loop()
    installed = []
    shutting_down: set[asyncio.Task[None]] = set()

    program = logging.getLogger(program_name())

    def on_signal(signum: int) -> None:
        program.info("received %s; shutting down", signal.Signals(signum).name)
        for runtime in runtimes:
            if not runtime.is_shutdown:
                task = loop.create_task(runtime.shutdown())
                shutting_down.add(task)
                task.add_done_callback(shutting_down.discard)

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def remove() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)

    return remove


def uses_uvloop(argv: Sequence[str] | None = None) -> bool:
    """Whether `run_program` runs on uvloop: when it is installed, unless ``--no-uvloop`` is in
    ``argv`` (default: this program's) or ``DYN_NB_UVLOOP=0``; never inside a notebook kernel.

    Example:
        >>> uses_uvloop(["--no-uvloop"])
        False
    """
    argv = sys.argv[1:] if argv is None else argv
    if "--no-uvloop" in argv or os.environ.get("DYN_NB_UVLOOP", "1") == "0" or in_notebook():
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


SERVING_GC_THRESHOLDS = (10_000, 50, 100)
"""Python's cyclic collector in a serving program: the youngest generation every 10,000 net
allocations instead of 700 (a streamed token allocates a handful of objects, so the default
collected every hundred or so tokens)."""


def tune_gc_for_serving() -> None:
    """Set a long-running program's garbage collector as servers do: the objects that exist now
    (modules, classes, what start-up built) are frozen out of every later collection, and the
    young generation is collected less often (`SERVING_GC_THRESHOLDS`). `run_program` calls it;
    ``DYN_NB_GC=default`` keeps Python's settings. Memory is still freed by reference counting
    as soon as it is unused; only cycles wait longer. Measured: about 10 % less frontend CPU
    per 32-token stream at concurrency 128, 5 % less mocker CPU (docs/benchmarks.md).

    Example::

        tune_gc_for_serving()  # in a program's entry point, never in a library or a kernel
    """
    if os.environ.get("DYN_NB_GC", "") == "default" or in_notebook():
        return
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)


def run_tuned(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end as our components run: the collector tuned for serving
    (`tune_gc_for_serving`), on uvloop when it is installed (`uses_uvloop`). For a program's
    entry point (a benchmark's load generator, a baseline server), never a library.

    Example::

        report = run_tuned(main(args))
    """
    tune_gc_for_serving()
    if uses_uvloop():
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def run_program(main: Callable[[], Awaitable[int]]) -> int:
    """Run a component's ``async def main()`` as a program (`run_tuned`: on uvloop when it is
    installed, the collector tuned for serving): a `ConfigError` is one line and exit 2.

    Example::

        if __name__ == "__main__":
            sys.exit(run_program(main))
    """
    try:
        return run_tuned(main())  # type: ignore[arg-type]  # main() is the program's coroutine; run_tuned is typed for any awaitable's result
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


RUNTIMES = ("dynamo_nb", "dynamo")
"""Whose runtime a program runs on: the kit's, or NVIDIA Dynamo's (`dynamo_nb.on_dynamo`)."""
OTHER_RUNTIMES = {"dynamo": "dynamo_nb.on_dynamo.runtime:runtime_from_config"}
"""Each runtime but the kit's: the coroutine function that starts it from a `RuntimeConfig`, by its
import path, loaded only when chosen (its package needs an extra; nothing here depends on it)."""


@dataclass(frozen=True)
class RuntimeConfig(Settings):
    """The runtime a component runs on, typed: built once in its ``main`` from the runtime flags
    (`from_args`; the flags' defaults are these), then started (`start`).

    Example:
        >>> from dynamo_nb.flags import echo_worker_parser
        >>> config = RuntimeConfig.from_args(echo_worker_parser().parse_args(["--discovery", "etcd://h:2379"]))
        >>> config.discovery, config.request_plane, config.system_port
        ('etcd://h:2379', None, -1)
    """

    runtime: str = setting(
        "dynamo_nb",
        flag="--runtime",
        env="RUNTIME",
        choices=RUNTIMES,
        help="whose runtime serves this program: the kit's (dynamo_nb) or NVIDIA Dynamo's (dynamo: behind "
        "python -m dynamo.frontend; --discovery file://DIR or etcd://HOST:PORT; python3 -m dynamo_nb install dynamo)",
    )
    dyn_tool_call_parser: str | None = setting(
        None,
        flag="--dyn-tool-call-parser",
        env="DYN_TOOL_CALL_PARSER",
        default_text="none",
        help="with --runtime dynamo: the format Dynamo's frontend reads this model's tool calls in (hermes, "
        "llama3_json, mistral, qwen3_coder, …), published with the model as Dynamo's own workers publish it; "
        "the kit's frontend takes --tool-call-parser instead",
    )
    discovery: str = setting(
        "memory",
        flag="--discovery",
        env="DISCOVERY",
        help="discovery backend: memory | file://DIR (processes of one host, no etcd) | etcd://HOST:PORT | static",
    )
    request_plane: str | None = setting(
        None,
        flag="--request-plane",
        env="REQUEST_PLANE",
        choices=("inproc", "tcp", "nats"),
        default_text="inproc with memory discovery, tcp with etcd, nats for --static with --nats-url",
        help="request plane",
    )
    nats_url: str | None = setting(
        None, flag="--nats-url", env="NATS_URL", default_text="none", help="NATS server, nats://HOST:PORT"
    )
    connect_timeout: float = setting(
        60.0,
        flag="--connect-timeout",
        env="CONNECT_TIMEOUT",
        help="seconds to wait at start for etcd and NATS to answer, so components may start in any order",
    )
    lease_ttl: float = setting(
        DEFAULT_LEASE_TTL,
        flag="--lease-ttl",
        env="LEASE_TTL",
        help="seconds after which a dead worker leaves etcd",
    )
    static: bool = setting(  # no discovery service (--static, or a frontend's --static-endpoint)
        False,
        flag="--static",
        default_text="off",
        help="static mode: no discovery service; serve at the subject derived from the endpoint path (NATS) "
        "or at --tcp-port (same as --discovery static)",
    )
    tcp_host: str | None = setting(  # None: loopback, or the address that reaches remote discovery
        None,
        flag="--tcp-host",
        env="TCP_HOST",
        default_text="127.0.0.1 when discovery and NATS are on this machine, else this host's address on the "
        "interface that reaches them",
        help="TCP plane listen host",
    )
    tcp_advertise_host: str | None = setting(
        None,
        flag="--tcp-advertise-host",
        env="TCP_ADVERTISE_HOST",
        default_text="--tcp-host, or for 0.0.0.0 the address that reaches discovery; never a wildcard",
        help="host discovery gives clients for the TCP plane",
    )
    tcp_port: int = setting(0, flag="--tcp-port", env="TCP_PORT", help="TCP plane port, 0 = free")
    cluster_secret_file: str | None = setting(
        None,
        flag="--cluster-secret-file",
        env="CLUSTER_SECRET_FILE",
        default_text="none, or the secret itself in DYN_NB_CLUSTER_SECRET; else no secret",
        help="require peers of the TCP plane and the bootstrap server to know the secret in this file "
        "(a keyed handshake)",
    )
    allow_unauthenticated: bool = setting(
        False,
        flag="--allow-unauthenticated",
        env="ALLOW_UNAUTHENTICATED",
        default_text="off",
        help="listen off loopback without a cluster secret or TLS, on a network you trust (by default a "
        "component refuses to, as anyone reaching its port could use it)",
    )
    tls_cert: str | None = setting(
        None,
        flag="--tls-cert",
        env="TLS_CERT",
        default_text="none, no TLS",
        help="PEM certificate: the TCP plane and the bootstrap server speak TLS",
    )
    tls_key: str | None = setting(
        None, flag="--tls-key", env="TLS_KEY", default_text="none", help="its PEM key"
    )
    tls_ca: str | None = setting(
        None,
        flag="--tls-ca",
        env="TLS_CA",
        default_text="none",
        help="PEM CA that peers' certificates must be signed by; with --tls-cert, clients need one too (mutual TLS)",
    )
    system_host: str = setting(
        "127.0.0.1",
        flag="--system-host",
        env="SYSTEM_HOST",
        help="host of the system status server (/live, /health)",
    )
    system_port: int = setting(  # -1: no system status server
        -1,
        flag="--system-port",
        env="SYSTEM_PORT",
        help="serve /live and /health for probes at this port, 0 = free, -1 = off",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, static: bool = False, **overrides: Any) -> RuntimeConfig:
        """The config the runtime flags (`dynamo_nb.flags.add_runtime_args`) give; ``static``:
        the component runs without discovery whatever ``--static`` says."""
        config = super().from_args(args, **overrides)
        return replace(config, static=True) if static else config

    async def start(self) -> ServingRuntime:
        """The runtime ``runtime`` names, started: the kit's (`start_kit`), or with
        ``runtime="dynamo"`` NVIDIA Dynamo's (`dynamo_nb.on_dynamo.DynamoRuntime`), created from
        these settings; either serves what a component's ``main`` serves (`ServingRuntime`)."""
        starter = OTHER_RUNTIMES.get(self.runtime)
        if starter is None:
            return await self.start_kit()
        module, _, name = starter.partition(":")
        start_other = getattr(importlib.import_module(module), name)
        runtime: ServingRuntime = await start_other(self)
        return runtime

    async def start_kit(self) -> DistributedRuntime:
        """The kit's own runtime, with its system status server (``/live``, ``/health``) when
        ``system_port`` is 0 or more; what peers must present (the cluster secret, TLS) holds for
        the whole process (`dynamo_nb.runtime.security.configure`). A program that needs the
        kit's runtime (the frontend) starts this one: another ``runtime`` is refused, saying so."""
        if self.runtime != "dynamo_nb":
            raise ConfigError(  # (a runtime not in RUNTIMES is refused when the config is made)
                f"--runtime {self.runtime!r}: this program runs on the kit's runtime (dynamo_nb); on NVIDIA "
                "Dynamo's runtime its frontend is python -m dynamo.frontend"
            )
        if self.dyn_tool_call_parser is not None:
            raise ConfigError(
                "--dyn-tool-call-parser is for --runtime dynamo (Dynamo's frontend reads the calls); on the kit's "
                "runtime start the frontend with --tool-call-parser instead"
            )
        security = PlaneSecurity.from_settings(
            self.cluster_secret_file, self.tls_cert, self.tls_key, self.tls_ca, self.allow_unauthenticated
        )
        configure(security)
        runtime = await DistributedRuntime.create(
            "static" if self.static else self.discovery,
            self.request_plane,
            self.nats_url,
            lease_ttl=self.lease_ttl,
            tcp_host=self.tcp_host,
            tcp_port=self.tcp_port,
            tcp_advertise_host=self.tcp_advertise_host,
            connect_timeout=self.connect_timeout,
            security=security,
        )
        if self.system_port >= 0:
            try:
                await start_system_status(runtime, self.system_host, self.system_port)
            except BaseException:
                await runtime.shutdown(grace=0)
                raise
        return runtime


async def runtime_from_args(args: argparse.Namespace, *, static: bool = False) -> ServingRuntime:
    """The runtime the runtime flags describe (``--runtime``: the kit's or NVIDIA Dynamo's):
    `RuntimeConfig.from_args` (``static``: no discovery whatever ``--static`` says), started."""
    return await RuntimeConfig.from_args(args, static=static).start()


async def kit_runtime_from_args(args: argparse.Namespace, *, static: bool = False) -> DistributedRuntime:
    """`runtime_from_args` for a program that runs on the kit's runtime only (the frontend: as a
    frontend's ``--static-endpoint``, ``static`` runs it without discovery)."""
    return await RuntimeConfig.from_args(args, static=static).start_kit()


def configure_logging(level: str = "INFO", service: str | None = None) -> None:
    """Log to stderr at ``level`` (a name such as ``INFO``), one line per record, as every
    component does; a line about a request names it (`dynamo_nb.telemetry.request_ids`). Tracing
    starts too when ``DYN_NB_TRACE`` asks (`dynamo_nb.telemetry.tracing`; ``service``: the
    process's name in its spans, by default the script's)."""
    name = str(level).upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ConfigError(f"--log-level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=name, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())
    if enable_tracing_from_env(service or Path(sys.argv[0]).stem or "dynamo_nb"):
        atexit.register(flush_tracing)


def ready_line(subject: str, **fields: object) -> str:
    """``READY <subject> key=value ...`` (values must not contain spaces)."""
    parts = [READY, subject]
    for key, value in fields.items():
        text = str(value)
        if not text or any(ch.isspace() for ch in text):
            raise ConfigError(f"READY field {key}={text!r} must be one word")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def announce_ready(subject: str, **fields: object) -> None:
    """Print the READY line (flushed): the component serves now."""
    print(ready_line(subject, **fields), flush=True)


def parse_ready_line(line: str) -> tuple[str, dict[str, str]] | None:
    """``(subject, fields)`` of a READY line; None when ``line`` is not one."""
    words = line.split()
    if len(words) < 2 or words[0] != READY:
        return None
    fields = dict(word.split("=", 1) for word in words[2:] if "=" in word)
    return words[1], fields
