"""The distributed runtime: namespaces, components and endpoints served and called across processes.

Everything a worker or a frontend needs to find and call the others lives here:

- `DistributedRuntime` (``distributed.py``) and the ``namespace → component → endpoint`` names
  (``names.py``, ids in ``ids.py``), and ``instance.py``: `Instance`, one server as published;
- the server side (``server.py``: `EndpointServer`, one task per request) and the client side
  (``client.py``: `Client`, `ResponseStream`), with the per-request `Context` (``context.py``),
  ``streams.py`` (closing any stream a handler returns) and ``suspects.py`` (`SuspectInstances`:
  instances suspected of hanging, routed around by the clients that share it);
- ``discovery/`` (memory, file, etcd, static: who serves what) and ``planes/`` (inproc, tcp, nats
  request planes; the msgpack wire format; the event plane);
- ``bounded_decode.py``: msgpack and JSON from the network decoded with memory bounded by their size;
- ``security.py``: who may connect to the TCP plane and the bootstrap server (a cluster secret, TLS);
- ``addresses.py``: `AddressRule`, the host a server listens on and the one it advertises;
- ``program.py``: running a component as a program (signals, logging, its READY line);
  ``serving.py``: `ServingRuntime`, what a component's ``main`` uses of a runtime (the kit's
  or NVIDIA Dynamo's);
  ``startup.py``: `wait_for_service`, etcd and NATS tried until they answer;
  ``system_status.py``: a worker's ``/live`` and ``/health`` (``--system-port``).

Example:
    >>> import asyncio
    >>> from dynamo_nb.runtime import DistributedRuntime
    >>> async def main():
    ...     async with await DistributedRuntime.create() as rt:
    ...         return str(rt.namespace("demo").component("echo").endpoint("generate").path)
    >>> asyncio.run(main())
    'demo.echo.generate'
"""

from __future__ import annotations

from .client import Client, ResponseStream
from .context import Context
from .distributed import Component, DistributedRuntime, Endpoint, Namespace
from .instance import Instance, format_instance_id, parse_instance_id
from .names import EndpointPath
from .program import (
    RuntimeConfig,
    announce_ready,
    configure_logging,
    dynamo_worker,
    kit_runtime_from_args,
    parse_ready_line,
    ready_line,
    run_program,
    runtime_from_args,
    shutdown_on_signals,
)
from .security import ClusterSecret, PlaneSecurity, TlsFiles
from .server import EndpointServer, Handler
from .serving import ServedInstance, ServingEndpoint, ServingRuntime

__all__ = [
    "Client",
    "ClusterSecret",
    "Component",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "EndpointPath",
    "EndpointServer",
    "Handler",
    "Instance",
    "Namespace",
    "PlaneSecurity",
    "ResponseStream",
    "RuntimeConfig",
    "ServedInstance",
    "ServingEndpoint",
    "ServingRuntime",
    "TlsFiles",
    "announce_ready",
    "configure_logging",
    "dynamo_worker",
    "format_instance_id",
    "kit_runtime_from_args",
    "parse_instance_id",
    "parse_ready_line",
    "ready_line",
    "run_program",
    "runtime_from_args",
    "shutdown_on_signals",
]
