"""Our runtime flags as Dynamo's: the arguments of its ``DistributedRuntime`` and its ``DYN_*``
environment.

Example:
    >>> planes = DynamoPlanes.from_flags("file:///tmp/kv", None, None, tcp_host=None)
    >>> planes.discovery_backend, planes.request_plane, planes.event_plane
    ('file', 'tcp', 'zmq')
    >>> planes.environment["DYN_FILE_KV"], planes.environment["DYN_TCP_RPC_HOST"]
    ('/tmp/kv', '127.0.0.1')
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..runtime.addresses import is_loopback

__all__ = ["DynamoPlanes"]

LOOPBACK = "127.0.0.1"


DYNAMO_SYSTEM_PORT_MAX = 32767
"""The highest ``DYN_SYSTEM_PORT`` Dynamo 1.6.1 accepts (it parses the port as an ``i16``)."""

_WORKERS_ONLY = ("DYN_SYSTEM_PORT", "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS")
"""A worker's system server settings: Dynamo's frontend does not serve one (it warns if asked)."""


@dataclass(frozen=True)
class DynamoPlanes:
    """What Dynamo's runtime is created with: ``DistributedRuntime(loop, discovery_backend,
    request_plane, event_plane=...)`` and the environment it reads (etcd and NATS addresses,
    the folder of file discovery, the hosts its servers bind)."""

    discovery_backend: str
    request_plane: str
    event_plane: str
    environment: dict[str, str] = field(default_factory=dict)
    allow_unauthenticated: bool = False
    discovery: str = ""  # the --discovery URL given
    nats_url: str | None = None

    @property
    def kv_events_allowed(self) -> bool:
        """Whether an engine's KV events may be published: over NATS (nothing listens here), or
        over ZMQ only where listening unauthenticated is allowed. Dynamo 1.6.1's ZMQ publisher
        binds every interface (``tcp://0.0.0.0:PORT``, whatever ``DYN_EVENT_PLANE_HOST`` says)
        and checks no one who connects."""
        return self.event_plane == "nats" or self.allow_unauthenticated

    def check_listeners(self, tcp_flag: str = "--tcp-host") -> None:
        """Refuse (`ConfigError`) hosts off loopback for Dynamo's request plane and system
        server unless ``allow_unauthenticated``: Dynamo's planes have no cluster secret or TLS,
        so the kit's secret cannot protect them (the kit's rule: `dynamo_nb.runtime.security`).
        ``tcp_flag``: the setting the message names for the request plane's host.

        Example:
            >>> DynamoPlanes.from_flags("file:///tmp/kv", None, None, tcp_host="0.0.0.0").check_listeners()
            Traceback (most recent call last):
            ...
            dynamo_nb.errors.ConfigError: Dynamo's TCP request plane would listen on 0.0.0.0, and Dynamo's runtime has no cluster secret or TLS of its own (the kit's secret does not reach it), so anyone who reaches it could use it: keep --tcp-host on loopback, or pass --allow-unauthenticated on a network you trust
        """
        if self.allow_unauthenticated:
            return
        for variable, what, flag in (
            ("DYN_TCP_RPC_HOST", "Dynamo's TCP request plane", tcp_flag),
            ("DYN_SYSTEM_HOST", "Dynamo's system server", "--system-host"),
        ):
            host = self.environment.get(variable, LOOPBACK)
            if not is_loopback(host.strip("[]")):
                raise ConfigError(
                    f"{what} would listen on {host}, and Dynamo's runtime has no cluster secret or TLS of "
                    "its own (the kit's secret does not reach it), so anyone who reaches it could use it: "
                    f"keep {flag} on loopback, or pass --allow-unauthenticated on a network you trust"
                )

    @classmethod
    def from_flags(
        cls,
        discovery: str,
        request_plane: str | None,
        nats_url: str | None,
        *,
        tcp_host: str | None,
        system_host: str = LOOPBACK,
        system_port: int = -1,
        allow_unauthenticated: bool = False,
    ) -> DynamoPlanes:
        """Map ``--discovery`` (``file://DIR`` or ``etcd://HOST:PORT``: Dynamo's frontend runs in
        another process, so ``memory`` and ``static`` cannot be used), ``--request-plane``
        (``tcp``, default, or ``nats``), ``--nats-url`` (NATS is then the event plane too, else
        ZMQ) and ``--tcp-host`` (what Dynamo's servers bind: 127.0.0.1 unless given);
        ``--system-host`` and ``--system-port`` (Dynamo's system server, ``/health``, ``/live``
        and ``/metrics``: ``DYN_SYSTEM_PORT``, none unless the port is 0 or more);
        ``allow_unauthenticated`` (``--allow-unauthenticated``): see `check_listeners`."""
        host = tcp_host or LOOPBACK
        env = {
            "DYN_TCP_RPC_HOST": host,
            "DYN_TCP_RESPONSE_STREAM_HOST": host,
            "DYN_EVENT_PLANE_HOST": host,
            "DYN_SYSTEM_HOST": system_host,
            "DYN_SELF_HOST_METADATA": "0",  # the card names the model folder; nothing served over HTTP
        }
        if system_port > DYNAMO_SYSTEM_PORT_MAX:
            raise ConfigError(
                f"--runtime dynamo --system-port {system_port}: Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a "
                f"16-bit signed number, so its system server takes ports up to {DYNAMO_SYSTEM_PORT_MAX}: "
                "choose a lower port, or 0 for a free one"
            )
        if system_port >= 0:
            env["DYN_SYSTEM_PORT"] = str(system_port)
            # its /health says ready once the endpoint every kit worker serves by default
            # (NS.COMP.generate) is served, as Dynamo's own workers ask; the variable set wins
            env["DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"] = os.environ.get(
                "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS", '["generate"]'
            )
        if discovery.startswith("file://"):
            backend = "file"
            env["DYN_FILE_KV"] = discovery.removeprefix("file://")
            _refuse_the_kits_folder(env["DYN_FILE_KV"])
        elif discovery.startswith("etcd://"):
            backend = "etcd"
            where = urlsplit(discovery)
            env["ETCD_ENDPOINTS"] = f"http://{where.netloc}"
        else:
            raise ConfigError(
                f"--runtime dynamo --discovery {discovery}: Dynamo's frontend runs in another process, so "
                "use --discovery file://DIR (one host) or etcd://HOST:PORT"
            )
        plane = request_plane or "tcp"
        if plane not in ("tcp", "nats"):
            raise ConfigError(f"--runtime dynamo --request-plane {plane}: Dynamo's planes are tcp and nats")
        if plane == "nats" and not nats_url:
            raise ConfigError("--runtime dynamo --request-plane nats needs --nats-url nats://HOST:PORT")
        if nats_url:
            env["NATS_SERVER"] = nats_url
        env["DYN_DISCOVERY_BACKEND"] = backend
        env["DYN_REQUEST_PLANE"] = plane
        event_plane = "nats" if nats_url else "zmq"
        env["DYN_EVENT_PLANE"] = event_plane
        return cls(backend, plane, event_plane, env, allow_unauthenticated, discovery, nats_url)

    def frontend_environment(self, http_host: str = LOOPBACK) -> dict[str, str]:
        """The environment ``python -m dynamo.frontend`` needs to find and reach these workers."""
        shared = {name: value for name, value in self.environment.items() if name not in _WORKERS_ONLY}
        return {**shared, "DYN_HTTP_HOST": http_host}  # a worker's system server is not the frontend's

    @staticmethod
    def frontend_argv(port: int = 8000, http_host: str = LOOPBACK) -> list[str]:
        """``python -m dynamo.frontend`` on ``http_host``:``port`` (this Python), as a command's words."""
        return [sys.executable, "-m", "dynamo.frontend", "--http-host", http_host, "--http-port", str(port)]

    def frontend_command(self, port: int = 8000, *, kit: bool = False) -> str:
        """The shell command that starts Dynamo's frontend for workers of these settings, ready
        to paste: with ``kit`` the kit's short form (``python -m dynamo_nb dynamo-frontend``),
        else ``python -m dynamo.frontend`` with its environment spelled out.

        Example:
            >>> planes = DynamoPlanes.from_flags("file:///tmp/kv", None, None, tcp_host=None)
            >>> planes.frontend_command(kit=True).split(" ", 1)[1]
            '-m dynamo_nb dynamo-frontend --discovery file:///tmp/kv --http-port 8000'
            >>> planes.frontend_command().startswith("DYN_DISCOVERY_BACKEND=file DYN_EVENT_PLANE=zmq")
            True
        """
        python = shlex.quote(sys.executable)
        if kit:
            words = ["--discovery", self.discovery]
            if self.nats_url:
                words += ["--nats-url", self.nats_url]
            if self.request_plane != "tcp":
                words += ["--request-plane", self.request_plane]
            return f"{python} -m dynamo_nb dynamo-frontend {shlex.join([*words, '--http-port', str(port)])}"
        settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.frontend_environment().items()))
        return f"{settings} {shlex.join(self.frontend_argv(port))}"

    def apply(self) -> None:
        """Set the environment in this process (Dynamo's runtime reads it when it is created)."""
        os.environ.update(self.environment)

    def describe(self) -> str:
        """One line: how the flags became Dynamo's settings.

        Example:
            >>> DynamoPlanes.from_flags("etcd://127.0.0.1:2379", None, None, tcp_host=None).describe()
            "Dynamo's runtime: discovery etcd, request plane tcp, event plane zmq (DYN_DISCOVERY_BACKEND=etcd DYN_EVENT_PLANE=zmq DYN_EVENT_PLANE_HOST=127.0.0.1 DYN_REQUEST_PLANE=tcp DYN_SELF_HOST_METADATA=0 DYN_SYSTEM_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_TCP_RPC_HOST=127.0.0.1 ETCD_ENDPOINTS=http://127.0.0.1:2379)"
        """
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.environment.items()))
        return (
            f"Dynamo's runtime: discovery {self.discovery_backend}, request plane {self.request_plane}, "
            f"event plane {self.event_plane} ({settings})"
        )


def _refuse_the_kits_folder(folder: str) -> None:
    """A folder the kit's runtime uses (its ``leases/`` and ``keys/``) is not Dynamo's: a worker
    registered there on Dynamo's runtime would be seen by no frontend."""
    root = Path(folder)
    if (root / "leases").is_dir() and (root / "keys").is_dir():
        raise ConfigError(
            f"{root} is the kit's runtime's discovery folder (it holds leases/ and keys/), which Dynamo's "
            "runtime and frontend cannot read: give --runtime dynamo a folder of its own, and serve it with "
            f"Dynamo's frontend (python -m dynamo_nb dynamo-frontend --discovery file://DIR)"
        )
