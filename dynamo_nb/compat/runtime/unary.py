"""Dynamo's unary helpers (``dynamo.runtime.UnaryClient``, ``serve_unary_endpoint``): one request,
one response, over the streaming endpoints underneath.

A unary handler is a coroutine ``handler(request, *, context)`` returning one value; served, it
is a stream of exactly one item. A `UnaryClient` asks by round robin and gets that one item back;
an endpoint that answers nothing or more than one item is a ``RuntimeError``, as on Dynamo.

Example::

    async def add(request, *, context):
        return {"sum": request["a"] + request["b"]}

    serving = asyncio.create_task(serve_unary_endpoint(runtime.endpoint("calc.math.add"), add))
    client = UnaryClient(await runtime.endpoint("calc.math.add").client())
    await client.complete({"a": 1, "b": 2})     # {"sum": 3}
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

__all__ = ["UnaryClient", "collect_one", "serve_unary_endpoint"]


class UnaryClient:
    """One response per request from a Dynamo client (``await endpoint.client()``), by round robin."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def complete(self, request: Any, *, context: Any = None) -> Any:
        """The endpoint's one response to ``request`` (``context`` links it, as for ``generate``)."""
        stream = await self._client.round_robin(request, annotated=False, context=context)
        return await collect_one(stream)


async def serve_unary_endpoint(endpoint: Any, handler: Callable[..., Awaitable[Any]]) -> None:
    """Serve ``handler(request, *, context)`` on ``endpoint`` until the runtime shuts down; each
    call's return value is the request's one response."""

    async def generate(request: Any, *, context: Any) -> AsyncIterator[Any]:
        yield await handler(request, context=context)

    await endpoint.serve_endpoint(generate)


async def collect_one(stream: Any) -> Any:
    """The only item of ``stream``; ``RuntimeError`` when it has none or more than one."""
    iterator = stream.__aiter__()
    try:
        try:
            response = await iterator.__anext__()
        except StopAsyncIteration:
            raise RuntimeError("unary endpoint returned no response") from None
        try:
            await iterator.__anext__()
        except StopAsyncIteration:
            return response
        raise RuntimeError("unary endpoint returned multiple responses")
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
