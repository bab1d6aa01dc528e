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

import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

__all__ = ["close_stream", "closing"]

T = TypeVar("T")


async def close_stream(stream: AsyncIterator[object]) -> None:
    """Close ``stream`` if it can be closed (``aclose``); nothing otherwise."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """``stream`` for an ``async with`` block, closed on leaving it however the block ends."""
    try:
        yield stream
    finally:
        await close_stream(stream)
