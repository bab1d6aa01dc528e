"""A worker's system status server: ``GET /live`` and ``GET /health`` for orchestrators.

A frontend answers health checks on its HTTP port; a worker has no HTTP port of its own. With
``--system-port`` (env ``DYN_NB_SYSTEM_PORT``, as Dynamo's ``DYN_SYSTEM_PORT``) a worker also
serves, on ``--system-host`` (default 127.0.0.1):

- ``/live``: 200 while its event loop answers (a liveness probe);
- ``/health``: 200 once it serves at least one endpoint and is not shutting down, else 503
  (a readiness probe); the body lists the endpoints it serves and the streams each is serving
  now (``inflight``).

Example::

    python components/hf_worker.py --discovery etcd://127.0.0.1:2379 --system-port 9090
    curl http://127.0.0.1:9090/health
    # {"status": "ready", "endpoints": ["dynamo.backend.generate"], "inflight": {"dynamo.backend.generate": 0}}
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..http import ConnectionGuard, HttpRequest, HttpResponse, HttpServer, json_response

if TYPE_CHECKING:
    from .distributed import DistributedRuntime

__all__ = ["start_system_status"]

logger = logging.getLogger("dynamo_nb.system_status")


def health_of(runtime: DistributedRuntime) -> tuple[int, dict[str, Any]]:
    """``(status code, body)`` of ``/health`` for ``runtime``: ready once it serves an endpoint."""
    endpoints = [str(server.endpoint.path) for server in runtime.servers]
    inflight = {str(server.endpoint.path): server.inflight for server in runtime.servers}
    if runtime.is_shutdown:
        return 503, {"status": "shutting down", "endpoints": endpoints, "inflight": inflight}
    if not endpoints:
        return 503, {"status": "starting", "endpoints": [], "inflight": {}}
    return 200, {"status": "ready", "endpoints": endpoints, "inflight": inflight}


async def start_system_status(runtime: DistributedRuntime, host: str, port: int) -> str:
    """Serve ``/live`` and ``/health`` for ``runtime`` at ``host:port`` (0: a free port) until the
    runtime shuts down; returns the server's URL.

    Example::

        url = await start_system_status(runtime, "127.0.0.1", 0)   # http://127.0.0.1:41234
    """
    event_loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # "uvloop" or "asyncio"

    async def live(_request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live", "event_loop": event_loop})

    async def health(_request: HttpRequest) -> HttpResponse:
        status, body = health_of(runtime)
        return json_response(body, status=status)

    server = HttpServer(
        {"/live": {"GET": live}, "/health": {"GET": health}},
        ConnectionGuard(),
        max_body=64 * 1024,  # its routes take no body
        name="the status server",
    )
    try:
        await server.start(host, port)
    except OSError as exc:
        raise ConfigError(
            f"--system-port {port}: cannot listen on {host}:{port} ({exc}); choose another port or 0"
        ) from None
    url = f"http://{host}:{server.port}"

    async def serve_until_shutdown() -> None:
        try:
            await asyncio.Event().wait()  # cancelled when the runtime shuts down
        finally:
            await server.stop(grace=0)

    runtime.spawn(serve_until_shutdown(), name="dynamo_nb system status")
    logger.info("system status at %s (/live, /health)", url)
    return url
