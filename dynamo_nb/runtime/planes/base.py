"""What every request plane provides: serve targets, open streams to instances."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import InstanceDownError, InvalidRequestError
from ..instance import Instance

if TYPE_CHECKING:
    from ..server import EndpointServer
    from .channel import StreamChannel

logger = logging.getLogger("dynamo_nb.planes")

__all__ = [
    "HEARTBEAT_INTERVAL",
    "RequestPlane",
    "StreamHandle",
    "instance_down",
    "liveness_ticks",
    "set_nodelay",
]

# A server sends a heartbeat on a silent stream (or connection) this often; a client gives
# up on it after its heartbeat timeout (several intervals, DistributedRuntime.create).
HEARTBEAT_INTERVAL = 1.0


async def liveness_ticks() -> AsyncIterator[tuple[float, bool]]:
    """``(now, stalled)`` every half heartbeat interval, for a plane's heartbeat task.

    ``stalled`` is True when this event loop itself did not run for more than an interval (a
    notebook cell that blocked, a process starved of CPU): frames that arrived meanwhile are
    still unread, so a peer's silence proves nothing this round.
    """
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        await asyncio.sleep(HEARTBEAT_INTERVAL / 2)
        now = loop.time()
        if now - last > 2 * HEARTBEAT_INTERVAL:  # its peers may have given up on its streams
            logger.info(
                "this event loop did not run for %.1f s (a blocking call, or no CPU for it)", now - last
            )
        yield now, now - last > HEARTBEAT_INTERVAL
        last = now


class StreamHandle(Protocol):
    """The caller's handle on one open stream."""

    def stop(self) -> None:
        """Tell the server to stop the handler (best effort, never blocks)."""

    def release(self) -> None:
        """Forget the stream: frames that still arrive are dropped."""


class RequestPlane(ABC):
    """Moves requests to servers and their streamed items back."""

    name: str = ""

    def __init__(self, *, heartbeat_timeout: float = 5.0) -> None:
        self.heartbeat_timeout = heartbeat_timeout

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect or prepare; called by the runtime before anything is served."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def add_target(
        self, target: str, server: EndpointServer, *, static: bool = False
    ) -> dict[str, str]:
        """Serve ``target`` with ``server``; return the transport record clients use to reach it."""

    @abstractmethod
    async def remove_target(self, target: str) -> None:
        """Stop routing new requests for ``target`` here."""

    @abstractmethod
    async def open_stream(
        self,
        instance: Instance,
        request_id: str,
        body: Any,
        channel: StreamChannel,
        metadata: dict[str, Any] | None = None,
    ) -> StreamHandle:
        """Send a request to ``instance`` (with the caller's context ``metadata``, when it has
        some); its frames arrive on ``channel``.

        Raises `InstanceDownError` when the instance cannot be reached.
        """

    @abstractmethod
    async def ping(self, instance: Instance, timeout: float) -> bool:
        """True if ``instance`` answers (used for static endpoints, which discovery cannot list)."""


def set_nodelay(transport: Any) -> None:
    """Turn Nagle's algorithm off on ``transport``'s TCP socket (asyncio and uvloop do by default;
    said here so every socket we own is sure to): a small frame goes out at once, not after the
    peer's delayed ACK (~40 ms).

    Example::

        def connection_made(self, transport): set_nodelay(transport)
    """
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def instance_down(instance: Instance, reason: str) -> InstanceDownError:
    """An `InstanceDownError` for ``instance`` with ``reason``."""
    return InstanceDownError(
        f"instance {instance.instance_id:x} of {instance.path} is unreachable: {reason}",
        endpoint=str(instance.path),
        instance_id=instance.instance_id,
    )


def encode_request_error(exc: Exception) -> InvalidRequestError:
    """The error for a request msgpack cannot carry."""
    return InvalidRequestError(
        f"request cannot be sent ({exc}); requests must be JSON-able (dict, list, str, int, float, bool, None)"
    )
