"""Server side: one served instance of an endpoint and the streams it is running."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import DynamoNBError, InvalidHandlerError, WorkerUnavailableError, error_details
from ..telemetry.request_ids import set_request_id
from ..telemetry.tracing import span, tracing_enabled
from .context import Context
from .instance import Instance
from .planes.wire import ErrorCode
from .streams import close_stream

if TYPE_CHECKING:
    from .distributed import Endpoint

__all__ = ["STOP_GRACE_SECONDS", "EndpointServer", "Handler", "ResponseSink", "ServerStream", "adapt_handler"]

logger = logging.getLogger("dynamo_nb.server")

Handler = Callable[..., AsyncIterator[Any]]

# After a stop, a handler gets this long to return on its own before it is cancelled.
STOP_GRACE_SECONDS = 0.05


class ResponseSink(Protocol):
    """Where the frames of one server stream go; each request plane provides one."""

    def item(self, data: Any) -> None:
        """Send one stream item; raises TypeError/ValueError if it cannot be encoded."""

    def end(self) -> None:
        """The stream finished normally."""

    def error(self, code: str, error_type: str, message: str, details: dict[str, Any] | None = None) -> None:
        """The stream failed; ``details`` carry the HTTP answer of one of our errors (`error_details`)."""

    def congested(self) -> bool:
        """True when the peer is not keeping up; the driver then awaits `drain`."""

    def drain(self) -> Awaitable[None]:
        """Wait until the peer catches up."""


def adapt_handler(handler: Any) -> Callable[[Any, Context], AsyncIterator[Any]]:
    """Return ``call(request, context)`` for a ``handler(request)`` or ``handler(request, context)``.

    Raises `InvalidHandlerError` with what to change for anything that is not an async generator.

    Example:
        >>> async def generate(request):
        ...     yield request
        >>> call = adapt_handler(generate)
    """
    if not callable(handler):
        raise InvalidHandlerError(f"handler must be callable, got {type(handler).__name__}")
    target = handler if inspect.isroutine(handler) else type(handler).__call__
    if inspect.iscoroutinefunction(target):
        raise InvalidHandlerError(
            f"handler {_name(handler)} is a coroutine function (async def ... return); it must be an "
            "async generator: use `yield` for each stream item"
        )
    if inspect.isfunction(target) or inspect.ismethod(target):
        if not inspect.isasyncgenfunction(target):
            raise InvalidHandlerError(
                f"handler {_name(handler)} must be an async generator: `async def {_name(handler)}"
                "(request, context): ... yield item`"
            )
    try:
        params = [
            p
            for p in inspect.signature(handler).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):
        params = []
    takes_context = len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
    if not params:
        raise InvalidHandlerError(
            f"handler {_name(handler)} takes no arguments; it must accept (request) or (request, context)"
        )
    if takes_context:
        return handler
    return lambda request, context: handler(request)


def _name(handler: Any) -> str:
    return getattr(handler, "__qualname__", None) or type(handler).__name__


def _raised_by_the_handler() -> bool:
    """Whether the `CancelledError` being handled came from the handler, not from a cancel of
    this task (Python 3.11+ counts cancel requests; on 3.10 every one counts as a cancel)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() == 0


class ServerStream:
    """One running request: its context, the task that drives the handler, and its sink."""

    __slots__ = ("_timer", "context", "grace", "sink", "task")

    def __init__(self, context: Context, sink: ResponseSink, grace: float = STOP_GRACE_SECONDS) -> None:
        self.context = context
        self.sink = sink
        self.grace = grace
        self.task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def stop(self) -> None:
        """Stop requested (by the caller or a lost connection): set the flag, cancel after a grace."""
        if self.context.is_stopped() and self._timer is not None:
            return
        self.context.stop_generating()
        task = self.task
        if task is not None and not task.done() and self._timer is None:
            self._timer = task.get_loop().call_later(self.grace, task.cancel)

    def finished(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class EndpointServer:
    """One served instance of an endpoint, returned by `Endpoint.serve`.

    Example::

        server = await endpoint.serve(generate)
        hex(server.instance_id), server.inflight
        # ('0x694d9a...', 0)
        await server.stop()
    """

    def __init__(
        self, endpoint: Endpoint, handler: Handler, instance: Instance, stop_grace: float = STOP_GRACE_SECONDS
    ) -> None:
        self.endpoint = endpoint
        self.stop_grace = stop_grace  # seconds a stopped handler may run on before it is cancelled
        self.instance = instance
        self._call = adapt_handler(handler)
        self._streams: set[ServerStream] = set()
        self._closing = False
        self._withdrawn = False
        self._stopped = asyncio.Event()
        self.requests_total = 0
        self.cancelled_total = 0
        self.errors_total = 0

    def serve_with(self, handler: Handler) -> None:
        """Run ``handler`` for the requests that come from now on; those under way finish with
        the handler they started with (`dynamo_nb.llm.serve_llm` drops its readiness gate so,
        once the model card is out: one generator less per streamed item).

        Example::

            server.serve_with(engine_handler(engine.generate, emit=True))
        """
        self._call = adapt_handler(handler)

    @property
    def instance_id(self) -> int:
        """This instance's 64-bit id (with etcd: the runtime's lease id)."""
        return self.instance.instance_id

    @property
    def address(self) -> str:
        """Where clients reach it, e.g. ``tcp://127.0.0.1:40123`` or ``nats://<subject>``."""
        t = self.instance.transport
        return f"{t.get('kind')}://{t.get('address')}"

    @property
    def inflight(self) -> int:
        """Streams running now."""
        return len(self._streams)

    def start_stream(
        self, request_id: str, body: Any, sink: ResponseSink, metadata: dict[str, Any] | None = None
    ) -> ServerStream | None:
        """Run the handler for one request (its context carries the caller's ``metadata``);
        frames go to ``sink``. Called by request planes."""
        if self._closing:
            sink.error(ErrorCode.NO_INSTANCE, "InstanceStopped", "the instance is shutting down")
            return None
        context = Context(request_id, metadata=metadata)
        context.emit = sink.item
        stream = ServerStream(context, sink, self.stop_grace)
        self._streams.add(stream)
        self.requests_total += 1
        stream.task = asyncio.get_running_loop().create_task(self._drive(stream, body))
        return stream

    async def _drive(self, stream: ServerStream, body: Any) -> None:
        set_request_id(stream.context.id)  # this task's log lines name the request
        if tracing_enabled():  # the handler's span joins the caller's trace (its traceparent)
            attributes = {"endpoint": str(self.endpoint.path), "request_id": stream.context.id}
            with span("handle", attributes, parent=stream.context.metadata):
                await self._run(stream, body)
        else:
            await self._run(stream, body)

    async def _run(self, stream: ServerStream, body: Any) -> None:
        sink, context = stream.sink, stream.context
        try:
            generator = self._call(body, context)
            if not hasattr(generator, "__anext__"):
                raise InvalidHandlerError(
                    f"handler returned {type(generator).__name__}, not an async iterator: use `yield`"
                )
            async for item in generator:
                try:
                    sink.item(item)
                except (TypeError, ValueError, OverflowError) as exc:
                    self.errors_total += 1
                    await close_stream(generator)
                    sink.error(
                        ErrorCode.ENCODE,
                        type(exc).__name__,
                        f"handler yielded an item that cannot be sent ({exc}); yield JSON-able values "
                        "(dict, list, str, int, float, bool, None)",
                    )
                    return
                if sink.congested():
                    await sink.drain()
            sink.end()
        except asyncio.CancelledError as exc:
            if context.is_stopped():  # cancelled by us after the stop grace: a normal end
                sink.end()
                return
            if not self._closing and _raised_by_the_handler():
                # the handler raised CancelledError itself: its error, not this server's end, so the
                # caller does not take a live instance for a stopping one
                self.errors_total += 1
                sink.error(ErrorCode.HANDLER, "CancelledError", str(exc))
                return
            sink.error(ErrorCode.SHUTDOWN, "Cancelled", "the server stopped before the handler finished")
            raise
        except WorkerUnavailableError as exc:  # its server is down: the caller takes this instance as down
            self.errors_total += 1
            logger.warning("%s cannot serve now: %s", self.endpoint.path, exc)
            sink.error(ErrorCode.NO_INSTANCE, type(exc).__name__, str(exc))
        except Exception as exc:
            self.errors_total += 1
            # one of ours (a peer gone, a bad request) says what happened in its message; anything
            # else may be a bug in the handler: its traceback goes with it
            logger.warning(
                "handler of %s raised %s: %s", self.endpoint.path, type(exc).__name__, exc,
                exc_info=not isinstance(exc, DynamoNBError),
            )  # fmt: skip
            sink.error(ErrorCode.HANDLER, type(exc).__name__, str(exc), error_details(exc))
        finally:
            if context.is_stopped():
                self.cancelled_total += 1
            stream.finished()
            self._streams.discard(stream)

    @property
    def withdrawn(self) -> bool:
        """Whether this instance has left discovery for a while (`withdraw`)."""
        return self._withdrawn

    async def withdraw(self) -> None:
        """Leave discovery for a while, serving on: clients stop sending it requests, the streams
        under way finish (what a worker does while what it serves with is down); `rejoin` comes
        back under the same instance id."""
        if not self._withdrawn and not self._closing:
            self._withdrawn = True
            await self.endpoint.runtime._withdraw(self)

    async def rejoin(self) -> None:
        """Come back to discovery after `withdraw` (clients send it requests again)."""
        if self._withdrawn and not self._closing:
            self._withdrawn = False
            await self.endpoint.runtime._rejoin(self)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: leave discovery, refuse new requests, let running streams finish.

        Streams still running after ``grace`` seconds are stopped (their handlers see
        ``context.is_stopped()`` and are cancelled shortly after).
        """
        if self._closing:
            await self._stopped.wait()
            return
        self._closing = True
        try:
            await self.endpoint.runtime._unserve(self)
            tasks = [s.task for s in self._streams if s.task is not None]
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=grace)
                if pending:
                    for stream in list(self._streams):
                        stream.stop()
                    await asyncio.wait(pending, timeout=1.0)
        finally:
            self._stopped.set()

    def __repr__(self) -> str:
        state = "serving" if not self._closing else "stopped"
        return f"<EndpointServer {self.endpoint.path} instance={self.instance_id:x} {self.address} {state}>"
