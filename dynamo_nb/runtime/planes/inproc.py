"""The in-process request plane: a handler's items go straight into the caller's stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..instance import Instance
from .base import RequestPlane, StreamHandle, instance_down
from .channel import StreamChannel

if TYPE_CHECKING:
    from ..server import EndpointServer, ServerStream

__all__ = ["InprocPlane"]

# Shared by every runtime of the process, like memory discovery.
_TARGETS: dict[str, EndpointServer] = {}


class _InprocSink:
    __slots__ = ("channel",)

    def __init__(self, channel: StreamChannel) -> None:
        self.channel = channel

    def item(self, data: Any) -> None:
        self.channel.push_item(data)

    def end(self) -> None:
        self.channel.push_end()

    def error(self, code: str, error_type: str, message: str, details: dict[str, Any] | None = None) -> None:
        self.channel.push_error_frame(code, error_type, message, details)

    def congested(self) -> bool:
        return False

    async def drain(self) -> None:
        return None


class _InprocHandle:
    __slots__ = ("stream",)

    def __init__(self, stream: ServerStream | None) -> None:
        self.stream = stream

    def stop(self) -> None:
        if self.stream is not None:
            self.stream.stop()

    def release(self) -> None:
        self.stream = None


class InprocPlane(RequestPlane):
    """Requests to servers in this process: no encoding, no sockets."""

    name = "inproc"

    async def close(self) -> None:
        return None

    async def add_target(
        self, target: str, server: EndpointServer, *, static: bool = False
    ) -> dict[str, str]:
        _TARGETS[target] = server
        return {"kind": "inproc", "address": target, "target": target}

    async def remove_target(self, target: str) -> None:
        _TARGETS.pop(target, None)

    async def open_stream(
        self,
        instance: Instance,
        request_id: str,
        body: Any,
        channel: StreamChannel,
        metadata: dict[str, Any] | None = None,
    ) -> StreamHandle:
        server = _TARGETS.get(instance.target)
        if server is None:
            raise instance_down(instance, "no in-process server for it (is it served by another process?)")
        return _InprocHandle(server.start_stream(request_id, body, _InprocSink(channel), metadata))

    async def ping(self, instance: Instance, timeout: float) -> bool:
        return instance.target in _TARGETS
