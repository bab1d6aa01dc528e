"""Dynamo's ``dynamo.runtime`` names, on dynamo_nb's runtime: Dynamo programs run with one import changed.

Change ``from dynamo.runtime import ...`` (or ``from dynamo._core import ...``) to
``from dynamo_nb.compat.runtime import ...``; the rest of a Dynamo worker or client stays as it is::

    from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_endpoint, dynamo_worker

    @dynamo_endpoint(str, str)
    async def generate(request: str):
        for word in request.split(","):
            yield f"Hello {word}!"

    @dynamo_worker()
    async def worker(runtime: DistributedRuntime):
        await runtime.endpoint("hello_world.backend.generate").serve_endpoint(generate)

Where the services are: ``DistributedRuntime(loop, "etcd", ...)`` reads ``ETCD_ENDPOINTS``
(default ``http://localhost:2379``) and ``NATS_SERVER`` as Dynamo does; ``"file"`` uses
``DYN_FILE_KV`` (default ``/tmp/dynamo_store_kv``), ``"mem"`` stays in this process.
``DYN_NB_DISCOVERY`` (``memory``, ``file://DIR``, ``etcd://HOST:PORT``) overrides all of them,
so an unchanged Dynamo program runs in a notebook with no etcd at all.

As on Dynamo, Ctrl-C raises ``KeyboardInterrupt``, SIGTERM ends the process, and a handler the
program installs itself stays in place (`dynamo_nb.compat.runtime.signals`). The request plane
is TCP unless ``DYN_REQUEST_PLANE=nats``, as on Dynamo 1.6. A stop reaches the handler however
the caller lets go (it stops, breaks out, exits, or dies), on both planes; a stopped request
yields nothing more to its caller, and a handler that ignores the stop is closed at the second
item it yields after the stop (Dynamo resumes it once more after the first).
A failed stream raises a ``ValueError`` with Dynamo's message (`StreamError`).

Differences from Dynamo 1.6.1 (on purpose), each with its reason:

- the runtime connects on its first ``await`` (``create_service``, ``client``,
  ``serve_endpoint``) instead of in the constructor: a constructor never blocks a running loop
  (a notebook's);
- ``runtime.shutdown()`` schedules the shutdown and returns; ``await runtime.shutdown_async()``
  waits for it (a synchronous call cannot wait inside a running loop);
- ``@dynamo_worker()`` shuts the runtime down when the function returns (Dynamo leaves that to
  the process exit): the instance leaves discovery at once, not when its lease expires;
- SIGTERM to a program with no handler of its own first takes the runtime out of discovery (for
  at most a second), then ends the process by SIGTERM: Dynamo's registrations stay until their
  lease expires, and callers meanwhile route to a worker that is gone;
- a handler that raises ``asyncio.CancelledError`` after its context was stopped ends the
  caller's stream as stopped (Dynamo logs it as an error on the worker): it did what it was asked;
- a stopped handler that neither returns nor yields within `DYNAMO_STOP_GRACE` seconds is
  cancelled (Dynamo waits for it): a handler stuck in a wait cannot hold a request forever;
- ``client.wait_for_instances()`` gives up after ``timeout`` seconds (300 by default) instead
  of waiting forever: every wait has a bound;
- ``Context.kill()`` (older Dynamo's) stops the request as ``stop_generating()`` does and marks
  it killed: the remote handler sees a stop, not an abort, so its cleanup runs;
- ``Context.metadata`` is a plain dict of JSON-able values (Dynamo's ``ContextMetadata`` is
  dict-like): it crosses the wire as msgpack, never pickled;
- ``DistributedRuntime(loop, is_static=True)`` and the ``kubernetes`` discovery backend are
  refused with what to use instead (etcd, a folder or memory discover instances here);
  ``enable_nats`` is accepted and ignored (NATS carries requests when ``DYN_REQUEST_PLANE=nats``).

Not provided (Dynamo 1.6.1 names this module lacks), each with its reason:

- ``PyAsyncRequestStream``, ``Endpoint.serve_bidirectional_endpoint``: a request is one message
  here; requests that are themselves streams are not supported;
- ``DistributedRuntime.detached``, ``DistributedRuntime.to_capsule``: they hand the Rust runtime
  to other Rust code, and there is no Rust core here;
- ``DistributedRuntime.register_engine_route``, ``DistributedRuntime.set_health_status``,
  ``DistributedRuntime.system_status_server_url``: a worker's status server is dynamo_nb's own
  (``--system-port``, `dynamo_nb.runtime.system_status`), with no routes to add;
- ``Endpoint.register_endpoint_instance``, ``Endpoint.unregister_endpoint_instance``,
  ``Endpoint.connection_id``: an instance registers when it serves and leaves when it stops,
  with the runtime's lease;
- ``Endpoint.metrics``, ``Endpoint.first_token_source``: metrics are the frontend's and the
  engines' own (Prometheus text at ``/metrics``);
- ``Client.instances``, ``Client.device_aware_weighted``,
  ``Client.wait_for_instance_by_runtime_data``, ``Client.wait_for_instances_by_runtime_data``:
  instances carry no runtime data or device topology here; ``instance_ids()`` lists them;
- ``Context.detached``, ``Context.current_span``, ``Context.span_id``,
  ``Context.parent_span_id``, ``Context.trace_id``, ``Context.trace_headers``,
  ``Context.start_span``, ``Context.notify_first_token``: there are no tracing spans
  (OpenTelemetry is not a dependency); the request id and metadata travel instead.

Added here: ``Annotated`` (the items Dynamo's clients yield, named), ``Namespace`` and
``Component`` (older Dynamo's ``runtime.namespace(...).component(...)``), ``StreamError`` (what
a failed stream raises, a ValueError), ``DYNAMO_STOP_GRACE``.

``from dynamo.runtime.logging import configure_dynamo_logging`` becomes
``from dynamo_nb.compat.runtime.logging import configure_dynamo_logging``.

Beside this module (a table of contents over them):

- ``dynamo_api.py``: the classes and decorators above, on dynamo_nb's runtime;
- ``logging.py``: ``configure_dynamo_logging`` (``dynamo.runtime.logging``) on the standard library;
- ``signals.py``: what SIGTERM does to a Dynamo-shaped program (out of discovery first, then the
  process ends; a handler of its own is never replaced);
- ``unary.py``: `UnaryClient` and `serve_unary_endpoint`, one request and one response over the
  streaming endpoints.
"""

from __future__ import annotations

from .dynamo_api import (
    DYNAMO_STOP_GRACE,
    Annotated,
    Client,
    Component,
    Context,
    DistributedRuntime,
    Endpoint,
    Namespace,
    StreamError,
    dynamo_endpoint,
    dynamo_worker,
)
from .unary import UnaryClient, serve_unary_endpoint

__all__ = [
    "DYNAMO_STOP_GRACE",
    "Annotated",
    "Client",
    "Component",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "Namespace",
    "StreamError",
    "UnaryClient",
    "dynamo_endpoint",
    "dynamo_worker",
    "serve_unary_endpoint",
]
