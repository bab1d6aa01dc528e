"""`DynamoRuntime`: NVIDIA Dynamo's ``DistributedRuntime`` with the part of ours a component's
``main`` uses (``endpoint(path).serve(handler)``, ``shutdown``, ``wait_closed``), so the same
program runs on either.

A handler served here gets Dynamo's request dict and a context of ours (`dynamo_nb.Context`,
stopped when Dynamo's is: the caller left or cancelled); the kit's errors reach Dynamo's frontend
as the HTTP status they carry (an `InvalidRequestError` is a 400 there too).

Example::

    runtime = await DynamoRuntime.create(DynamoPlanes.from_flags("file:///tmp/kv", None, None, tcp_host=None))
    server = await runtime.endpoint("demo.echo.generate").serve(handler)
    await runtime.wait_closed()          # until runtime.shutdown()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import DynamoNBError, NotReadyError
from ..extras import require_extra
from ..runtime.context import Context
from ..runtime.names import EndpointPath
from ..runtime.server import adapt_handler
from ..runtime.streams import closing
from .planes import DynamoPlanes

if TYPE_CHECKING:
    from pathlib import Path

    from ..disagg.modes import WorkerRole
    from ..engines.engine_worker import EngineFactory, EngineWorker, ServesEngines
    from ..runtime.program import RuntimeConfig
    from ..runtime.serving import ServingRuntime

__all__ = ["DynamoEndpoint", "DynamoRuntime", "DynamoServer", "runtime_from_config"]

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 30.0
"""How long `DynamoEndpoint.serve` waits to see its own instance in Dynamo's discovery."""

SHUTDOWN_GRACE_S = 10.0
"""How long `DynamoRuntime.shutdown` lets Dynamo's servers finish their requests."""


@dataclass
class DynamoServer:
    """One endpoint served on Dynamo's runtime: its instance id (Dynamo's connection id), the
    request plane it is reached over, and its counters (as `dynamo_nb.EndpointServer`'s)."""

    path: EndpointPath
    instance_id: int
    address: str
    requests_total: int = 0
    cancelled_total: int = 0  # stopped by their caller before their end
    inflight: int = 0

    def __repr__(self) -> str:
        return f"<DynamoServer {self.path} instance={self.instance_id:x} {self.address}>"


class DynamoRuntime:
    """Dynamo's runtime behind the calls a component makes on ours (see the module docstring).

    Attributes:
        inner: Dynamo's ``dynamo.runtime.DistributedRuntime``.
        planes: how the flags became Dynamo's settings.
        tool_call_parser: ``--dyn-tool-call-parser``, published with each model served.
    """

    def __init__(self, inner: Any, planes: DynamoPlanes, *, tool_call_parser: str | None = None) -> None:
        self.inner = inner
        self.planes = planes
        self.tool_call_parser = tool_call_parser
        self._closed = asyncio.Event()
        self._serving: set[asyncio.Task[None]] = set()

    @classmethod
    async def create(cls, planes: DynamoPlanes, *, tool_call_parser: str | None = None) -> DynamoRuntime:
        """Set Dynamo's environment from ``planes``, create its runtime on the running loop and
        log once how the flags were mapped (``tool_call_parser``: the format Dynamo's frontend
        reads the served models' tool calls in). Without Dynamo's packages: `MissingExtraError`."""
        require_extra("dynamo", "--runtime dynamo")
        planes.apply()
        from dynamo.runtime import DistributedRuntime

        inner = DistributedRuntime(
            asyncio.get_running_loop(),
            planes.discovery_backend,
            planes.request_plane,
            event_plane=planes.event_plane,
        )
        logger.info("%s", planes.describe())
        logger.info(
            "Dynamo's frontend for this worker: %s   (or, spelled out: %s)",
            planes.frontend_command(kit=True),
            planes.frontend_command(),
        )
        return cls(inner, planes, tool_call_parser=tool_call_parser)

    @property
    def is_shutdown(self) -> bool:
        return self._closed.is_set()

    async def serve_engine(
        self, role: WorkerRole, model_path: Path, model_name: str, make_engine: EngineFactory
    ) -> EngineWorker:
        """Serve an engine as Dynamo's workers serve theirs, its model registered with Dynamo's
        ``register_model`` (`dynamo_nb.on_dynamo.worker.serve_engine_on_dynamo`): what
        `dynamo_nb.engines.engine_worker.serve_engine` asks of a runtime that is not the kit's."""
        from .worker import serve_engine_on_dynamo

        return await serve_engine_on_dynamo(self, role, model_path, model_name, make_engine)

    def endpoint(self, path: str | EndpointPath) -> DynamoEndpoint:
        """The endpoint ``ns.comp.ep`` on Dynamo's runtime."""
        return DynamoEndpoint(self, EndpointPath.parse(str(path)))

    async def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Stop Dynamo's runtime (its servers end, letting requests in flight finish for up to
        ``grace`` seconds); `wait_closed` returns."""
        if self._closed.is_set():
            return
        self.inner.shutdown()
        if self._serving:
            _, late = await asyncio.wait(set(self._serving), timeout=grace)
            for task in late:
                task.cancel()
        self._closed.set()

    async def wait_closed(self) -> None:
        """Return once the runtime is shut down."""
        await self._closed.wait()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    def __repr__(self) -> str:
        return f"<DynamoRuntime {self.planes.discovery_backend} {self.planes.request_plane}>"


class DynamoEndpoint:
    """An endpoint of Dynamo's runtime (``inner``: Dynamo's ``Endpoint``)."""

    def __init__(self, runtime: DynamoRuntime, path: EndpointPath) -> None:
        self.runtime = runtime
        self.path = path
        self.inner = runtime.inner.endpoint(str(path))

    async def serve(self, handler: Any, *, ready_timeout: float = READY_TIMEOUT_S) -> DynamoServer:
        """Serve ``handler`` (``handler(request)`` or ``handler(request, context)``, an async
        generator) with Dynamo's ``serve_endpoint``; returns once Dynamo's discovery lists this
        instance, so a READY line printed next is true."""
        call = adapt_handler(handler)
        server = DynamoServer(
            self.path, self.inner.connection_id(), f"dynamo+{self.runtime.planes.request_plane}"
        )

        async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
            # The handler runs in a task of its own, feeding this stream: when Dynamo stops the
            # request (the caller left) it stops polling this generator and may never close it,
            # so the stop cancels that task and the handler's (the engine's) stream is closed.
            ours = Context(str(context.id()))
            queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()
            producer = asyncio.ensure_future(_produce(call(request, ours), queue))
            watch = asyncio.ensure_future(_stop_when_stopped(context, ours, producer, server))
            server.requests_total += 1
            server.inflight += 1
            try:
                while True:
                    more, item = await queue.get()
                    if not more:
                        break
                    yield item
                await producer  # raises what the handler raised
            except DynamoNBError as exc:
                raise _http_error(exc) from exc
            except Exception as exc:  # the engine's or handler's bug: a 500 naming it, not a 400
                # (Dynamo's runtime logs it with this traceback chained: the request id beside it)
                raise _worker_failed(exc, self.path, server.instance_id, ours.id) from exc
            finally:
                server.inflight -= 1
                producer.cancel()
                watch.cancel()

        task = asyncio.ensure_future(self.inner.serve_endpoint(generate))
        self.runtime._keep(task)
        await self._wait_listed(server.instance_id, task, ready_timeout)
        return server

    async def _wait_listed(self, instance_id: int, serving: asyncio.Task[None], timeout: float) -> None:
        client = await self.inner.client()
        deadline = time.monotonic() + timeout
        while instance_id not in client.instance_ids():
            if serving.done():
                serving.result()  # Dynamo's error, as it raised it
                raise NotReadyError(f"Dynamo's serve_endpoint for {self.path} ended before it was listed")
            if time.monotonic() > deadline:
                raise NotReadyError(
                    f"{self.path} (instance {instance_id:x}) was not listed in Dynamo's discovery within "
                    f"{timeout:g} s: check {self.runtime.planes.discovery_backend} discovery is reachable"
                )
            await asyncio.sleep(0.05)

    def __repr__(self) -> str:
        return f"<DynamoEndpoint dyn://{self.path}>"


async def _produce(items: AsyncIterator[Any], queue: asyncio.Queue[tuple[bool, Any]]) -> None:
    """Put each item of the handler's stream on ``queue``, then ``(False, None)``; however it
    ends (cancelled included), the stream is closed."""
    try:
        async with closing(items):
            async for item in items:
                queue.put_nowait((True, item))
    finally:
        queue.put_nowait((False, None))


async def _stop_when_stopped(
    theirs: Any, ours: Context, producer: asyncio.Future[None], server: DynamoServer
) -> None:
    """When Dynamo's context is stopped or killed (the caller left or cancelled): stop ``ours``
    and cancel the handler's task, which closes its stream."""
    await theirs.async_killed_or_stopped()
    if producer.done():
        return
    server.cancelled_total += 1
    ours.stop_generating()
    producer.cancel()
    logger.info("request %s stopped by its caller: its stream is closed", ours.id)


def _http_error(exc: DynamoNBError) -> Exception:
    """The kit's error as Dynamo's ``HttpError``: its frontend answers with that status."""
    from dynamo.llm.exceptions import HttpError

    return HttpError(int(getattr(exc, "http_status", 500)), str(exc))


def _worker_failed(exc: Exception, path: EndpointPath, instance_id: int, request_id: str) -> Exception:
    """Any other exception as Dynamo's ``HttpError`` 500 naming it and the worker, as the kit's
    own frontend names it. A bare exception would reach the client as 400 "Invalid request" (the
    client's fault); Dynamo 1.6.1's frontend answers a 5xx with its own words ("Internal server
    error"), so the message is for Dynamo's own clients and the worker's log, next to the
    traceback and the request id (the ``chatcmpl-<id>`` a streamed answer carries)."""
    from dynamo.llm.exceptions import HttpError

    return HttpError(
        500,
        f"the worker failed: {type(exc).__name__}: {exc} (instance {instance_id:x} of {path}, "
        f"request {request_id}; its log has the traceback)",
    )


async def runtime_from_config(config: RuntimeConfig) -> DynamoRuntime:
    """NVIDIA Dynamo's runtime from the kit's runtime settings (``--runtime dynamo``): what
    `RuntimeConfig.start` runs for it (`dynamo_nb.runtime.program.OTHER_RUNTIMES`).

    Example::

        runtime = await RuntimeConfig(runtime="dynamo", discovery="file:///tmp/kv").start()
    """
    planes = DynamoPlanes.from_flags(
        "static" if config.static else config.discovery,
        config.request_plane,
        config.nats_url,
        tcp_host=config.tcp_host,
        system_host=config.system_host,
        system_port=config.system_port,
        allow_unauthenticated=config.allow_unauthenticated,
    )
    planes.check_listeners()
    return await DynamoRuntime.create(planes, tool_call_parser=config.dyn_tool_call_parser)


if TYPE_CHECKING:

    def _runs_the_kits_programs(runtime: DynamoRuntime) -> tuple[ServingRuntime, ServesEngines]:
        """mypy checks here that Dynamo's runtime is one a component's ``main`` and
        `dynamo_nb.engines.engine_worker.serve_engine` take."""
        return runtime, runtime
