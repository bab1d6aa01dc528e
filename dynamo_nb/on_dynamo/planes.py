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
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError

__all__ = ["DynamoPlanes"]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class DynamoPlanes:
    """What Dynamo's runtime is created with: ``DistributedRuntime(loop, discovery_backend,
    request_plane, event_plane=...)`` and the environment it reads (etcd and NATS addresses,
    the folder of file discovery, the hosts its servers bind)."""

    discovery_backend: str
    request_plane: str
    event_plane: str
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_flags(
        cls,
        discovery: str,
        request_plane: str | None,
        nats_url: str | None,
        *,
        tcp_host: str | None,
        system_host: str = LOOPBACK,
    ) -> DynamoPlanes:
        """Map ``--discovery`` (``file://DIR`` or ``etcd://HOST:PORT``: Dynamo's frontend runs in
        another process, so ``memory`` and ``static`` cannot be used), ``--request-plane``
        (``tcp``, default, or ``nats``), ``--nats-url`` (NATS is then the event plane too, else
        ZMQ) and ``--tcp-host`` (what Dynamo's servers bind: 127.0.0.1 unless given)."""
        host = tcp_host or LOOPBACK
        env = {
            "DYN_TCP_RPC_HOST": host,
            "DYN_TCP_RESPONSE_STREAM_HOST": host,
            "DYN_EVENT_PLANE_HOST": host,
            "DYN_SYSTEM_HOST": system_host,
            "DYN_SELF_HOST_METADATA": "0",  # the card names the model folder; nothing served over HTTP
        }
        if discovery.startswith("file://"):
            backend = "file"
            env["DYN_FILE_KV"] = discovery.removeprefix("file://")
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
        return cls(backend, plane, event_plane, env)

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
