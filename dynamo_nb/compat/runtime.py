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

Differences from Dynamo 1.6 (on purpose):

- the runtime connects on its first ``await`` (``create_service``, ``client``,
  ``serve_endpoint``) instead of in the constructor, so the constructor never blocks a loop;
- ``runtime.shutdown()`` schedules the shutdown and returns; ``await runtime.shutdown_async()``
  waits for it;
- a handler that raises ``asyncio.CancelledError`` after its context was stopped ends the
  caller's stream as stopped (Dynamo logs it as an error on the worker);
- a stopped request whose handler does not return within `DYNAMO_STOP_GRACE` seconds is
  cancelled (Dynamo waits for the handler);
- ``Context.kill()`` stops the request as ``stop_generating()`` does and marks it killed; the
  remote handler sees a stop, not an abort;
- the request plane is TCP unless ``DYN_REQUEST_PLANE=nats`` (Dynamo 1.6 defaults to TCP too);
- there is no Rust core: ``dynamo._core`` names map to this module as well;
- SIGTERM and Ctrl-C shut the runtime down (deregistering its endpoints) in a script, not in a
  notebook kernel.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..runtime import Context as _Context
from ..runtime import DistributedRuntime as _Runtime
from ..runtime.client import Client as _Client
from ..runtime.client import ResponseStream
from ..runtime.server import adapt_handler
from ..runtime.worker import shutdown_on_signals

DYNAMO_STOP_GRACE = 5.0
"""Seconds a stopped Dynamo handler may run on (checking ``context.is_stopped()``) before it is
cancelled; dynamo_nb's own handlers get 0.05 s."""

__all__ = [
    "DYNAMO_STOP_GRACE",
    "Annotated",
    "Client",
    "Component",
    "Context",
    "DistributedRuntime",
    "Endpoint",
    "Namespace",
    "dynamo_endpoint",
    "dynamo_worker",
]


class Context:
    """Dynamo's request context: ``id()``, ``metadata``, stop and kill.

    Example:
        >>> ctx = Context(metadata={"user": "a"})
        >>> ctx.kill()
        >>> ctx.is_stopped(), ctx.is_killed(), ctx.metadata["user"]
        (True, True, 'a')
    """

    def __init__(self, metadata: dict[str, Any] | None = None, *, _inner: _Context | None = None) -> None:
        self._inner = _inner if _inner is not None else _Context()
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._killed = False

    def id(self) -> str:
        """The request id."""
        return self._inner.id

    def stop_generating(self) -> None:
        """Ask the request to stop gracefully (the handler sees ``is_stopped()``)."""
        self._inner.stop_generating()

    def is_stopped(self) -> bool:
        return self._inner.is_stopped()

    def kill(self) -> None:
        """Stop the request at once (here: stop it and mark it killed)."""
        self._killed = True
        self._inner.stop_generating()

    def is_killed(self) -> bool:
        return self._killed

    async def async_killed_or_stopped(self) -> bool:
        """Wait until the request is stopped or killed."""
        return await self._inner.stopped()

    def __repr__(self) -> str:
        return f"<Context id={self.id()} stopped={self.is_stopped()} killed={self._killed}>"


class Annotated:
    """One stream item as Dynamo's clients see it: ``.data()`` is the value the handler yielded."""

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        self._data = data

    def data(self) -> Any:
        return self._data

    def __repr__(self) -> str:
        return f"Annotated({self._data!r})"


class _Stream:
    """A response stream whose items are `Annotated`."""

    def __init__(self, stream: ResponseStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Annotated:
        return Annotated(await self._stream.__anext__())

    async def aclose(self) -> None:
        await self._stream.aclose()


def _runtime_spec(store_kv: str) -> str:
    override = os.environ.get("DYN_NB_DISCOVERY")
    if override:
        return override
    if store_kv == "etcd":
        endpoint = os.environ.get("ETCD_ENDPOINTS", "http://localhost:2379").split(",")[0]
        return "etcd://" + endpoint.split("://", 1)[-1]
    if store_kv == "file":
        return "file://" + os.environ.get("DYN_FILE_KV", "/tmp/dynamo_store_kv")
    return "memory"


class DistributedRuntime:
    """Dynamo's ``DistributedRuntime(loop, store_kv, request_plane)``; connects on first use.

    Example::

        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp")
        client = await runtime.namespace("demo").component("server").endpoint("generate").client()
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, store_kv: str = "etcd", request_plane: Any = None
    ) -> None:
        self._spec = _runtime_spec(store_kv)
        plane = request_plane if isinstance(request_plane, str) else os.environ.get("DYN_REQUEST_PLANE")
        self._plane = None if self._spec == "memory" and plane is None else (plane or "tcp")
        self._nats_url = os.environ.get("NATS_SERVER") if self._plane == "nats" else None
        self._inner: _Runtime | None = None
        self._connecting: asyncio.Lock | None = None
        self._shutting_down: asyncio.Task[None] | None = None  # held: a bare task may be collected
        self.pending_cards: dict[str, list[Any]] = {}  # endpoint path → model cards register_llm built

    async def inner(self) -> _Runtime:
        """The dynamo_nb runtime underneath (created on first use)."""
        if self._inner is None:
            self._connecting = self._connecting or asyncio.Lock()
            async with self._connecting:
                if self._inner is None:
                    self._inner = await _Runtime.create(self._spec, self._plane, self._nats_url)
                    shutdown_on_signals(self._inner)  # as Dynamo's runtime: SIGTERM/Ctrl-C shut it down
        return self._inner

    def namespace(self, name: str) -> Namespace:
        return Namespace(self, name)

    def endpoint(self, path: str) -> Endpoint:
        """``runtime.endpoint("ns.comp.ep")``."""
        namespace, component, endpoint = path.removeprefix("dyn://").split(".", 2)
        return self.namespace(namespace).component(component).endpoint(endpoint)

    def shutdown(self) -> None:
        """Start shutting down (Dynamo's is synchronous); `shutdown_async` waits for it."""
        if self._inner is not None and self._shutting_down is None:
            self._shutting_down = asyncio.get_running_loop().create_task(self._inner.shutdown())

    async def shutdown_async(self) -> None:
        if self._inner is not None:
            await self._inner.shutdown()


class Namespace:
    def __init__(self, runtime: DistributedRuntime, name: str) -> None:
        self.runtime, self.name = runtime, name

    def component(self, name: str) -> Component:
        return Component(self, name)


class Component:
    def __init__(self, namespace: Namespace, name: str) -> None:
        self.namespace, self.name = namespace, name

    async def create_service(self) -> None:
        """Dynamo registers the component here; this connects the runtime (registration happens per endpoint)."""
        await self.namespace.runtime.inner()

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(self, name)


class Endpoint:
    def __init__(self, component: Component, name: str) -> None:
        self.component, self.name = component, name
        self.path = f"{component.namespace.name}.{component.name}.{name}"

    async def _inner(self) -> Any:
        return (await self.component.namespace.runtime.inner()).endpoint(self.path)

    async def serve_endpoint(
        self, handler: Callable[..., AsyncIterator[Any]], graceful_shutdown: bool = True, **_options: Any
    ) -> None:
        """Serve ``handler(request[, context])`` until the runtime shuts down."""
        endpoint = await self._inner()
        cards = self.component.namespace.runtime.pending_cards.pop(self.path, [])

        async def publish(_server: Any) -> None:  # the cards register_llm built, now that it serves
            from ..llm.register import publish_card

            for card in cards:
                await publish_card(endpoint, card)

        await endpoint.serve_endpoint(
            _with_dynamo_context(handler),
            graceful_shutdown=graceful_shutdown,
            stop_grace=DYNAMO_STOP_GRACE,
            on_serving=publish,
        )

    async def client(self) -> Client:
        return Client(await (await self._inner()).client())


class Client:
    """Dynamo's client: ``await client.generate(request, context=...)`` and the routing modes."""

    def __init__(self, client: _Client) -> None:
        self._client = client

    def instance_ids(self) -> list[int]:
        return self._client.instance_ids()

    async def wait_for_instances(self, timeout: float = 30.0) -> list[int]:
        return await self._client.wait_for_instances(timeout=timeout)

    async def generate(self, request: Any, context: Context | None = None) -> _Stream:
        """Round robin, as Dynamo's ``generate``."""
        return await self.round_robin(request, context=context)

    async def round_robin(self, request: Any, context: Context | None = None) -> _Stream:
        return _Stream(await self._client.round_robin(request, context=_inner_of(context)))

    async def random(self, request: Any, context: Context | None = None) -> _Stream:
        return _Stream(await self._client.random(request, context=_inner_of(context)))

    async def direct(self, request: Any, instance_id: int, context: Context | None = None) -> _Stream:
        return _Stream(await self._client.direct(request, instance_id, context=_inner_of(context)))


def _inner_of(context: Context | _Context | None) -> _Context | None:
    return context._inner if isinstance(context, Context) else context


def _with_dynamo_context(
    handler: Callable[..., AsyncIterator[Any]],
) -> Callable[[Any, _Context], AsyncIterator[Any]]:
    """``handler`` called with a Dynamo `Context`; a `CancelledError` it raises once stopped ends the stream."""
    call = adapt_handler(handler)

    async def serve(request: Any, context: _Context) -> AsyncIterator[Any]:
        try:
            async for item in call(request, Context(_inner=context)):
                yield item
        except asyncio.CancelledError:
            if not context.is_stopped():
                raise
            # the handler gave up because its caller stopped: the stream ends here

    return serve


def dynamo_worker(
    *_args: Any, **_kwargs: Any
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate ``async def worker(runtime, ...)``: a runtime (as `DistributedRuntime` finds
    its services) is created, passed first and shut down when the function ends."""

    def decorate(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            runtime = DistributedRuntime(asyncio.get_running_loop(), os.environ.get("DYN_STORE_KV", "etcd"))
            try:
                return await func(runtime, *args, **kwargs)
            finally:
                await runtime.shutdown_async()

        return wrapper

    return decorate


def dynamo_endpoint(
    request_type: Any = None, response_type: Any = None
) -> Callable[[Callable[..., AsyncIterator[Any]]], Callable[..., AsyncIterator[Any]]]:
    """Decorate a handler with its request and response types, as Dynamo's ``@dynamo_endpoint(Req, Resp)``:
    a pydantic request type parses the request (``model_validate``); a pydantic item is sent as its dict."""

    def decorate(func: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        call = adapt_handler(func)

        @functools.wraps(func)
        async def handler(request: Any, context: Any) -> AsyncIterator[Any]:
            if hasattr(request_type, "model_validate"):
                request = request_type.model_validate(request)
            async for item in call(request, context):
                yield item.model_dump() if hasattr(item, "model_dump") else item

        del handler.__wrapped__  # callers see (request, context), not the wrapped signature
        return handler

    return decorate
