"""Client side of one stream: the frames a request plane delivers, in order, to the caller."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from ...errors import InstanceDownError, RemoteHandlerError, RequestError
from ..instance import Instance
from .wire import ErrorCode

__all__ = ["NOT_READY", "StreamChannel", "error_from_frame"]

_ITEM, _END, _ERROR = 0, 1, 2
NOT_READY: Any = object()  # `StreamChannel.pop_item`'s answer when no item is queued


def error_from_frame(
    instance: Instance, code: str, error_type: str, message: str, details: dict[str, Any] | None = None
) -> RequestError:
    """Turn an ERROR frame into the exception the caller sees."""
    endpoint, iid = str(instance.path), instance.instance_id
    if code in (ErrorCode.HANDLER, ErrorCode.ENCODE):
        return RemoteHandlerError(
            error_type,
            message,
            endpoint=endpoint,
            instance_id=iid,
            details=details if isinstance(details, dict) else None,
        )
    if code == ErrorCode.NO_INSTANCE:
        return InstanceDownError(
            f"instance {iid:x} no longer serves {endpoint}: {message}", endpoint=endpoint, instance_id=iid
        )
    return InstanceDownError(
        f"instance {iid:x} of {endpoint} ended the stream early ({code}): {message}",
        endpoint=endpoint,
        instance_id=iid,
    )


class StreamChannel:
    """Ordered buffer of one stream's items, its end or its error.

    Planes call the ``push_*`` methods from their receive path; the caller awaits `next`.
    """

    __slots__ = ("_entries", "_loop", "_waiter", "closed", "instance", "last_seen")

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self._loop: asyncio.AbstractEventLoop | None = None  # kept: asking is a getpid system call (3.11)
        self._entries: deque[tuple[int, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False  # an end or error was pushed
        self.last_seen = 0.0  # loop time of the last frame (heartbeat bookkeeping)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def push_item(self, data: Any) -> None:
        if not self.closed:
            self._entries.append((_ITEM, data))
            self._wake()

    def push_end(self) -> None:
        if not self.closed:
            self.closed = True
            self._entries.append((_END, None))
            self._wake()

    def push_error(self, error: BaseException) -> None:
        if not self.closed:
            self.closed = True
            self._entries.append((_ERROR, error))
            self._wake()

    def push_error_frame(
        self, code: str, error_type: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        self.push_error(error_from_frame(self.instance, code, error_type, message, details))

    def fail(self, reason: str) -> None:
        """The transport lost the stream: the caller gets `InstanceDownError`."""
        inst = self.instance
        self.push_error(
            InstanceDownError(
                f"stream from instance {inst.instance_id:x} of {inst.path} was cut before its end: {reason}",
                endpoint=str(inst.path),
                instance_id=inst.instance_id,
            )
        )

    def pop_item(self) -> Any:
        """The next item if one is already here, else `NOT_READY` (an end, an error or nothing yet:
        `next` then says which): a reader takes what is queued without an ``await`` per item."""
        entries = self._entries
        if entries and entries[0][0] == _ITEM:
            return entries.popleft()[1]
        return NOT_READY

    @property
    def ready(self) -> int:
        """Entries waiting to be read (`next` returns at once while there are some)."""
        return len(self._entries)

    async def next(self) -> Any:
        """The next item; raises StopAsyncIteration at the end, or the stream's error."""
        entries = self._entries
        while not entries:
            if self.closed:  # the end or error was already consumed
                raise StopAsyncIteration
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        kind, payload = entries.popleft()
        if kind == _ITEM:
            return payload
        if kind == _END:
            raise StopAsyncIteration
        raise payload
