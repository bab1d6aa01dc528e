"""Dynamo's ``dynamo.runtime`` classes on dynamo_nb's runtime: `DistributedRuntime`, `Namespace`,
`Component`, `Endpoint`, `Client`, `Context`, `Annotated`, `StreamError`, `dynamo_worker` and
`dynamo_endpoint` (``dynamo_nb.compat.runtime`` lists them, with the differences from Dynamo).

Example::

    from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_worker
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from ...errors import ConfigError, InstanceDownError, RemoteHandlerError, RequestError
from ...llm.register import publish_card
from ...runtime import Context as _Context
from ...runtime import DistributedRuntime as _Runtime
from ...runtime.client import Client as _Client
from ...runtime.client import ResponseStream
from ...runtime.server import adapt_handler
from ...runtime.streams import close_stream
from .signals import end_on_sigterm

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
    "StreamError",
    "dynamo_endpoint",
    "dynamo_worker",
]


class Context:
    """Dynamo's request context: ``Context(id=None, metadata=None)``, ``id()``, ``metadata``, stop and kill.

    Example:
        >>> ctx = Context("req-1", metadata={"user": "a"})
        >>> ctx.kill()
        >>> ctx.id(), ctx.is_stopped(), ctx.is_killed(), ctx.metadata["user"]
        ('req-1', True, True, 'a')
        >>> ctx.metadata = {"user": "b"}
        >>> ctx.metadata
        {'user': 'b'}
    """

    def __init__(
        self, id: str | None = None, metadata: dict[str, Any] | None = None, *, _inner: _Context | None = None
    ) -> None:
        self._inner = _inner if _inner is not None else _Context(id, metadata=metadata)
        self._killed = False
        self._stopped_here = False  # stopped through this object (a handler that cut its own output)

    @property
    def metadata(self) -> dict[str, Any]:
        """JSON-able values that travel with the request: the handler's context has them too.
        Replaceable, as in Dynamo: ``ctx.metadata = {"user": "a"}`` before the request is sent."""
        return self._inner.metadata

    @metadata.setter
    def metadata(self, values: dict[str, Any]) -> None:
        if not isinstance(values, dict):
            raise TypeError(f"Context.metadata must be a dict, got {type(values).__name__}")
        self._inner.metadata = dict(values)

    def id(self) -> str:
        """The request id."""
        return self._inner.id

    def stop_generating(self) -> None:
        """Ask the request to stop gracefully (the handler sees ``is_stopped()``)."""
        self._stopped_here = self._stopped_here or not self._inner.is_stopped()
        self._inner.stop_generating()

    def is_stopped(self) -> bool:
        return self._inner.is_stopped()

    def kill(self) -> None:
        """Stop the request at once (here: stop it and mark it killed)."""
        self._killed = True
        self.stop_generating()

    def is_killed(self) -> bool:
        return self._killed

    async def async_killed_or_stopped(self) -> bool:
        """Wait until the request is stopped or killed."""
        return await self._inner.stopped()

    def __repr__(self) -> str:
        return f"<Context id={self.id()} stopped={self.is_stopped()} killed={self._killed}>"


class Annotated:
    """One stream item as Dynamo's clients see it: ``.data()`` is the value the handler yielded.

    A failed stream raises in the caller's loop instead of yielding an error item, so
    ``is_error()`` is always False here; ``event()``, ``comments()`` and ``id()`` are empty.

    Example:
        >>> item = Annotated("Hello world!")
        >>> item.data(), item.is_error(), item.comments()
        ('Hello world!', False, [])
    """

    __slots__ = ("_data",)

    def __init__(self, data: Any) -> None:
        self._data = data

    def data(self) -> Any:
        return self._data

    def is_error(self) -> bool:
        return False

    def event(self) -> str | None:
        return None

    def comments(self) -> list[str]:
        return []

    def id(self) -> str | None:
        return None

    def __repr__(self) -> str:
        return f"Annotated({self._data!r})"


class StreamError(RequestError, ValueError):
    """A stream that failed, raised as Dynamo raises it: a ``ValueError`` whose message starts
    with Dynamo's category (``Internal: RuntimeError: boom`` for a handler that raised,
    ``Cancelled: CancelledError:`` for one that raised ``CancelledError`` while not stopped,
    ``Unavailable: Stream ended before generation completed`` for a worker that went away or a
    handler that stopped its own request and returned);
    the dynamo_nb error is its ``__cause__``.

    Example:
        >>> issubclass(StreamError, ValueError)
        True
    """


class _EndedEarly(RequestError):
    """Raised for a handler that stopped its own request and returned (its name crosses the wire)."""


@contextlib.contextmanager
def _as_dynamo_errors() -> Iterator[None]:
    """A failed request raised as Dynamo raises it (`StreamError`, a ``ValueError``)."""
    try:
        yield
    except RemoteHandlerError as error:  # as Dynamo: ValueError("Internal: RuntimeError: boom")
        if error.error_type == _EndedEarly.__name__:
            raise StreamError("Unavailable: Stream ended before generation completed") from error
        category = "Cancelled" if error.error_type == "CancelledError" else "Internal"
        raise StreamError(f"{category}: {error.error_type}: {error.remote_message}") from error
    except InstanceDownError as error:  # the worker went away mid-stream
        raise StreamError(f"Unavailable: Stream ended before generation completed ({error})") from error


class _Stream:
    """A response stream whose items are `Annotated` (or the bare values, ``annotated=False``)."""

    def __init__(self, stream: ResponseStream, annotated: bool = True) -> None:
        self._stream = stream
        self._annotated = annotated

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Any:
        if self._stream.context.is_stopped():  # as on Dynamo: a stopped request yields nothing more
            await self._stream.aclose()
            raise StopAsyncIteration
        with _as_dynamo_errors():
            data = await self._stream.__anext__()
        return Annotated(data) if self._annotated else data

    async def aclose(self) -> None:
        await self._stream.aclose()


def _runtime_spec(store_kv: str | bool) -> str:
    override = os.environ.get("DYN_NB_DISCOVERY")
    if override:
        return override
    if store_kv is False:  # older Dynamo: DistributedRuntime(loop, is_static=False)
        store_kv = "etcd"
    elif store_kv is True:
        raise ConfigError(
            "DistributedRuntime: static mode (is_static=True) is not supported by the Dynamo-shaped API; "
            "use 'etcd', or 'file' for processes of one host with no etcd"
        )
    if store_kv == "etcd":
        endpoint = os.environ.get("ETCD_ENDPOINTS", "http://localhost:2379").split(",")[0]
        return "etcd://" + endpoint.split("://", 1)[-1]
    if store_kv == "file":
        return "file://" + os.environ.get("DYN_FILE_KV", "/tmp/dynamo_store_kv")
    if store_kv in ("mem", "memory"):
        return "memory"
    if store_kv == "kubernetes":
        raise ConfigError(
            "DistributedRuntime: the 'kubernetes' discovery backend is not supported here; use 'etcd', "
            "'file' or 'mem' (or set DYN_NB_DISCOVERY)"
        )
    raise ConfigError(
        f"DistributedRuntime: unknown discovery backend {store_kv!r}; use 'etcd', 'file' or 'mem'"
    )


def _discovery_backend() -> str:
    """The backend Dynamo's ``dynamo_worker`` reads: ``DYN_DISCOVERY_BACKEND``, else ``DYN_STORE_KV``."""
    return os.environ.get("DYN_DISCOVERY_BACKEND") or os.environ.get("DYN_STORE_KV") or "etcd"


class DistributedRuntime:
    """Dynamo's ``DistributedRuntime(loop, store_kv, request_plane)``; connects on first use.

    Example::

        runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp")
        client = await runtime.namespace("demo").component("server").endpoint("generate").client()
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        store_kv: str | bool = "etcd",
        request_plane: Any = None,
        enable_nats: bool | None = None,
    ) -> None:
        self._loop = loop
        self._spec = _runtime_spec(store_kv)
        plane = request_plane if isinstance(request_plane, str) else os.environ.get("DYN_REQUEST_PLANE")
        self._plane = None if self._spec == "memory" and plane is None else (plane or "tcp")
        self._nats_url = os.environ.get("NATS_SERVER") if self._plane == "nats" else None
        self._inner: _Runtime | None = None
        self._connecting: asyncio.Lock | None = None
        self._shutting_down: asyncio.Task[None] | None = None  # held: a bare task may be collected
        self.pending_cards: dict[str, list[Any]] = {}  # endpoint path → model cards register_llm built
        self.serving: dict[str, Any] = {}  # endpoint path → its dynamo_nb endpoint, once it serves

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the runtime was created with."""
        return self._loop

    async def inner(self) -> _Runtime:
        """The dynamo_nb runtime underneath (created on first use)."""
        if self._inner is None:
            self._connecting = self._connecting or asyncio.Lock()
            async with self._connecting:
                if self._inner is None:
                    self._inner = await _Runtime.create(self._spec, self._plane, self._nats_url)
                    end_on_sigterm(self._inner)  # Ctrl-C untouched; a program's own handler stays
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
        runtime = self.component.namespace.runtime
        endpoint = await self._inner()

        async def publish(_server: Any) -> None:  # the cards register_llm built, now that it serves
            runtime.serving[self.path] = endpoint  # a card registered from now on is published at once
            for card in runtime.pending_cards.pop(self.path, []):
                await publish_card(endpoint, card)

        try:
            await endpoint.serve_endpoint(
                _with_dynamo_context(handler),
                graceful_shutdown=graceful_shutdown,
                stop_grace=DYNAMO_STOP_GRACE,
                on_serving=publish,
            )
        finally:
            runtime.serving.pop(self.path, None)

    async def client(self) -> Client:
        return Client(await (await self._inner()).client())


class Client:
    """Dynamo's client: ``await client.generate(request, context=...)`` and the routing modes."""

    def __init__(self, client: _Client) -> None:
        self._client = client

    def instance_ids(self) -> list[int]:
        return self._client.instance_ids()

    async def wait_for_instances(self, timeout: float = 300.0) -> list[int]:
        return await self._client.wait_for_instances(timeout=timeout)

    async def generate(self, request: Any, annotated: bool = True, context: Context | None = None) -> _Stream:
        """A random instance, as Dynamo's ``generate``."""
        return await self.random(request, annotated, context)

    async def round_robin(
        self, request: Any, annotated: bool = True, context: Context | None = None
    ) -> _Stream:
        with _as_dynamo_errors():
            return _Stream(await self._client.round_robin(request, context=_inner_of(context)), annotated)

    async def random(self, request: Any, annotated: bool = True, context: Context | None = None) -> _Stream:
        with _as_dynamo_errors():
            return _Stream(await self._client.random(request, context=_inner_of(context)), annotated)

    async def direct(
        self, request: Any, instance_id: int, annotated: bool = True, context: Context | None = None
    ) -> _Stream:
        with _as_dynamo_errors():
            return _Stream(
                await self._client.direct(request, instance_id, context=_inner_of(context)), annotated
            )


def _inner_of(context: Context | _Context | None) -> _Context | None:
    return context._inner if isinstance(context, Context) else context


def _with_dynamo_context(
    handler: Callable[..., AsyncIterator[Any]],
) -> Callable[[Any, _Context], AsyncIterator[Any]]:
    """``handler`` called with a Dynamo `Context`; a `CancelledError` it raises once stopped ends the stream."""
    call = _dynamo_call(handler)

    async def serve(request: Any, context: _Context) -> AsyncIterator[Any]:
        dynamo_context = Context(_inner=context)
        items = call(request, dynamo_context)
        after_the_stop = 0
        try:
            async for item in items:
                after_the_stop += context.is_stopped() and not dynamo_context._stopped_here
                if after_the_stop == 2:
                    # as on Dynamo: once the caller stopped, the handler is resumed after one more
                    # item (a check of is_stopped() at the top of its loop runs) and closed at the
                    # next (it sees GeneratorExit at that yield)
                    await close_stream(items)
                    return
                yield item
        except asyncio.CancelledError:
            if not context.is_stopped():
                raise
            return  # the handler gave up because its caller stopped: the stream ends here
        if dynamo_context._stopped_here:  # it cut its own output: the caller must be able to tell
            raise _EndedEarly("the handler stopped its request before the end")

    return serve


def _accepts_context(func: Callable[..., Any]) -> bool:
    """Whether Dynamo would pass ``context=`` to ``func``: it has a ``context`` parameter or ``**kwargs``."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "context" or p.kind is p.VAR_KEYWORD for p in params)


def _dynamo_call(handler: Callable[..., AsyncIterator[Any]]) -> Callable[[Any, Any], AsyncIterator[Any]]:
    """``call(request, context)`` for a Dynamo handler: the context goes as the keyword ``context``
    when the handler takes one (as Dynamo's server passes it), else only the request."""
    adapt_handler(handler)  # the same checks (and clear errors) as dynamo_nb's own handlers
    if getattr(handler, "_dynamo_takes_context", False) or _accepts_context(handler):
        return lambda request, context: handler(request, context=context)
    return lambda request, context: handler(request)


def dynamo_worker(
    *_args: Any, **_kwargs: Any
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate ``async def worker(runtime, ...)``: a runtime (as `DistributedRuntime` finds
    its services: ``DYN_DISCOVERY_BACKEND`` or ``DYN_STORE_KV``) is created, passed first and
    shut down when the function ends."""

    def decorate(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            runtime = DistributedRuntime(asyncio.get_running_loop(), _discovery_backend())
            try:
                return await func(runtime, *args, **kwargs)
            finally:
                await runtime.shutdown_async()

        return wrapper

    return decorate


def dynamo_endpoint(
    request_type: Any = None, response_type: Any = None
) -> Callable[[Callable[..., AsyncIterator[Any]]], Callable[..., AsyncIterator[Any]]]:
    """Decorate a handler (a function, or a method taking ``self``) with its request and response
    types, as Dynamo's ``@dynamo_endpoint(Req, Resp)``: a pydantic request type parses the request
    (a dict, or a JSON string); a pydantic item is sent as its dict."""

    def decorate(func: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        adapt_handler(func)
        takes_context = _accepts_context(func)

        @functools.wraps(func)
        async def handler(*args: Any, context: Any = None) -> AsyncIterator[Any]:
            *owner, request = args  # a method is called with (self, request)
            if hasattr(request_type, "model_validate"):
                if isinstance(request, str | bytes):
                    request = request_type.model_validate_json(request)
                else:
                    request = request_type.model_validate(request)
            extra = {"context": context} if takes_context else {}
            async for item in func(*owner, request, **extra):
                yield item.model_dump() if hasattr(item, "model_dump") else item

        del handler.__wrapped__  # callers see (request, context=), not the wrapped signature
        handler._dynamo_takes_context = True  # type: ignore[attr-defined]  # a marker on the user's function, read by serve_endpoint
        return handler

    return decorate
