"""Closing a stream: any async iterator a handler or an engine returns, closed when it can be.

An async generator has ``aclose`` (it runs the generator's ``finally`` and frees what the request
held); a hand-written async iterator may not. `closing` and `close_stream` close either kind, so
the code that consumes a stream need not know which it got.

Example:
    >>> import asyncio
    >>> async def tokens():
    ...     try:
    ...         yield 1
    ...         yield 2
    ...     finally:
    ...         print("closed")
    >>> async def first():
    ...     async with closing(tokens()) as stream:
    ...         async for token in stream:
    ...             return token
    >>> asyncio.run(first())
    closed
    1
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

__all__ = ["close_stream", "closing"]

T = TypeVar("T")


async def close_stream(stream: AsyncIterator[object]) -> None:
    """Close ``stream`` if it can be closed (``aclose``); nothing otherwise."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class closing(Generic[T]):
    """``stream`` for an ``async with`` block, closed on leaving it however the block ends."""

    __slots__ = ("stream",)

    def __init__(self, stream: AsyncIterator[T]) -> None:
        self.stream = stream

    async def __aenter__(self) -> AsyncIterator[T]:
        return self.stream

    async def __aexit__(self, *exc_info: Any) -> None:
        await close_stream(self.stream)
