"""The NATS request plane: a subject per instance, replies streamed to the caller's inbox.

A request is one NATS message to the instance's subject, with ``reply`` set to an inbox of
the caller. The worker answers with messages to that inbox, each a run of msgpack frames;
the first carries an ACK naming the stream's control subject, where the caller sends STOP.
Static endpoints are served at the subject derived from their path, in a queue group, so
several static workers share the load.

A stop cannot be lost: every answer names the stream's control subject as its ``reply``, so
the worker learns the caller left even when the caller's STOP never went out (it exited at
once, or died). A caller still alive answers frames of a stream it let go with a STOP; once
its connection is gone, NATS answers the worker's next frame (at the latest its heartbeat, a
second later) with "no responders" on that subject, and the worker stops the handler.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
from nats.aio.client import Client as NatsConnection
from nats.aio.msg import Msg

from ...errors import ConfigError, ServiceUnavailableError
from ..bounded_decode import unpack_all_bounded
from ..instance import Instance
from ..security import redact_url
from ..startup import wait_for_service
from .base import (
    HEARTBEAT_INTERVAL,
    RequestPlane,
    StreamHandle,
    encode_request_error,
    instance_down,
    liveness_ticks,
)
from .channel import StreamChannel
from .wire import (
    ACK,
    END,
    ERROR,
    HEARTBEAT,
    ITEM,
    MAX_REQUEST_FRAME_BYTES,
    PING,
    PONG,
    REQUEST,
    STOP,
    ErrorCode,
    decode,
    encode,
    error_frame,
    request_fields,
    request_tail,
)

if TYPE_CHECKING:
    from ..names import EndpointPath
    from ..server import EndpointServer, ServerStream

__all__ = ["NatsPlane", "connect_nats", "instance_subject", "static_subject"]

logger = logging.getLogger("dynamo_nb.planes.nats")

STATIC_QUEUE_GROUP = "dynamo_nb"
_CONGESTED_BYTES = 1 << 20


def static_subject(path: EndpointPath) -> str:
    """The fixed subject of a static endpoint: ``dyn.{ns}.{comp}.{ep}``."""
    return f"dyn.{path.namespace}.{path.component}.{path.endpoint}"


def instance_subject(path: EndpointPath, instance_id: int) -> str:
    """The subject of one instance: ``dyn.{ns}.{comp}.{ep}-{instance_id:x}``."""
    return f"{static_subject(path)}-{instance_id:x}"


async def connect_nats(
    url: str,
    *,
    timeout: float = 5.0,
    name: str = "dynamo_nb",
    closing: Callable[[], bool] = lambda: False,
    on_reconnect: Callable[[], None] | None = None,
) -> NatsConnection:
    """Connect to NATS, trying for ``timeout`` seconds (`dynamo_nb.runtime.startup`), then
    failing with a message that says what to do.

    Once connected it reconnects for as long as the server is away (nats-py re-subscribes and
    sends what it buffered); ``on_reconnect()`` runs after each reconnection.
    ``closing()`` tells whether a disconnect is expected (no warning then).
    """
    shown = redact_url(url)  # a URL may carry a user and password: never logged
    if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise ConfigError(
            f"invalid NATS URL {shown!r}: expected 'nats://HOST:PORT' (or nats://USER:PASSWORD@HOST:PORT), "
            "e.g. nats://127.0.0.1:4222"
        )
    credentials = os.environ.get("DYN_NB_NATS_CREDS") or None  # a .creds file (JWT and NKEY seed)

    refused: list[Exception] = []  # the server's "Authorization Violation", if it said so

    async def on_error(exc: Exception) -> None:
        logger.debug("nats: %s: %s", type(exc).__name__, exc)
        if "authorization" in str(exc).lower():
            refused.append(exc)

    async def on_disconnect() -> None:
        if not closing():
            logger.warning("disconnected from NATS at %s; reconnecting", shown)

    async def on_reconnected() -> None:
        logger.warning("reconnected to NATS at %s", shown)
        if on_reconnect is not None:
            on_reconnect()

    async def on_closed() -> None:
        if not closing():
            logger.error("the connection to NATS at %s is closed for good", shown)

    async def attempt(seconds: float) -> NatsConnection:
        try:
            return await asyncio.wait_for(
                nats.connect(
                    url,
                    name=name,
                    connect_timeout=max(1, int(seconds)),
                    allow_reconnect=True,
                    max_reconnect_attempts=1,  # one attempt fails fast when nobody listens: tried again here
                    reconnect_time_wait=0.2,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnected,
                    closed_cb=on_closed,
                    user_credentials=credentials,
                ),
                seconds,
            )
        except (asyncio.TimeoutError, OSError, nats.errors.Error) as exc:
            if refused:
                raise ConfigError(
                    f"NATS at {shown} refused this connection ({refused[-1]}): give the user and password in "
                    "the URL, nats://USER:PASSWORD@HOST:PORT (a token: nats://TOKEN@HOST:PORT), or a .creds "
                    "file in DYN_NB_NATS_CREDS"
                ) from None
            raise ServiceUnavailableError(
                f"could not reach NATS at {shown} within {timeout:g} s ({type(exc).__name__}: {exc}). Start one "
                "from Python with `services = await dynamo_nb.LocalServices.start()` and pass services.nats_url, "
                "or run `nats-server` yourself."
            ) from exc

    connection = await wait_for_service(attempt, what="NATS", url=shown, timeout=timeout)
    connection.options["max_reconnect_attempts"] = -1  # once connected, a restarted server is waited for
    return connection


def _no_responders(msg: Msg) -> bool:
    """Whether ``msg`` is NATS saying nobody listens on the subject a message was sent to."""
    return msg.headers is not None and msg.headers.get("Status") == "503"


# ----------------------------------------------------------------------------- server side


class _NatsSink:
    """Frames of one server stream to the caller's inbox; one publish per burst of frames."""

    __slots__ = ("_pending", "_pending_bytes", "_publisher", "control", "last_sent", "plane", "reply")

    def __init__(self, plane: NatsPlane, reply: str, control: str) -> None:
        self.plane = plane
        self.reply = reply
        self.control = control  # this stream's control subject: STOPs and "no responders" come here
        self._pending: list[bytes] = [encode((ACK, 0, control))]
        self._pending_bytes = 0
        self._publisher: asyncio.Task[None] | None = None
        self.last_sent = asyncio.get_running_loop().time()

    def kick(self) -> None:
        """Publish what is queued (at least the ACK) on the next loop iteration.

        Called after the handler's task is created, so a handler that yields at once has its
        items, its end and the ACK go out together in one message.
        """
        if self._publisher is None and self._pending:
            self._publisher = asyncio.get_running_loop().create_task(self._publish())

    def _queue(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        self.kick()

    async def _publish(self) -> None:
        nc = self.plane.nc
        try:
            while self._pending:
                batch, self._pending, self._pending_bytes = self._pending, [], 0
                await nc.publish(self.reply, b"".join(batch), reply=self.control)
                self.last_sent = asyncio.get_running_loop().time()
        except Exception as exc:  # the caller's side will time out on its heartbeat
            logger.warning("could not publish a reply to %s: %s", self.reply, exc)
            self._pending.clear()
        finally:
            self._publisher = None

    def item(self, data: Any) -> None:
        self._queue(encode((ITEM, 0, data)))

    def end(self) -> None:
        self._queue(encode((END, 0)))
        self.plane._streams.pop(self.control, None)

    def error(self, code: str, error_type: str, message: str, details: dict[str, Any] | None = None) -> None:
        self._queue(encode(error_frame(0, code, error_type, message, details)))
        self.plane._streams.pop(self.control, None)

    def heartbeat(self) -> None:
        self._queue(encode((HEARTBEAT, 0)))

    def congested(self) -> bool:
        return self._pending_bytes > _CONGESTED_BYTES

    async def drain(self) -> None:
        if self._publisher is not None:
            await asyncio.shield(self._publisher)


# ----------------------------------------------------------------------------- client side


class _NatsHandle:
    __slots__ = ("channel", "control", "inbox", "plane", "stop_wanted")

    def __init__(self, plane: NatsPlane, inbox: str, channel: StreamChannel) -> None:
        self.plane = plane
        self.inbox = inbox
        self.channel = channel
        self.control: str | None = None
        self.stop_wanted = False

    def stop(self) -> None:
        if self.inbox not in self.plane._open:
            return
        if self.control is None:
            self.stop_wanted = True  # sent as soon as the worker's ACK says where
            return
        self.plane._spawn(self.plane.nc.publish(self.control, encode((STOP, self.inbox))))

    def release(self) -> None:
        if self.stop_wanted and self.control is None:
            return  # kept until the ACK arrives, so the STOP still goes out (or the watchdog drops it)
        self.plane._open.pop(self.inbox, None)


# ----------------------------------------------------------------------------- the plane


class NatsPlane(RequestPlane):
    """Request plane over NATS (nats-py).

    Example::

        rt = await DistributedRuntime.create(discovery=services.etcd_url,
            request_plane="nats", nats_url=services.nats_url)
    """

    name = "nats"

    def __init__(self, url: str, *, heartbeat_timeout: float = 5.0, connect_timeout: float = 5.0) -> None:
        super().__init__(heartbeat_timeout=heartbeat_timeout)
        self.url = url
        self.connect_timeout = connect_timeout
        self._nc: NatsConnection | None = None
        self.control_subject = ""
        self._inbox_prefix = ""
        self._targets: dict[str, tuple[EndpointServer, Any]] = {}
        self._streams: dict[str, tuple[ServerStream | None, _NatsSink]] = {}
        self._open: dict[str, _NatsHandle] = {}
        self._pings: dict[str, asyncio.Future[bool]] = {}
        self._next = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def nc(self) -> NatsConnection:
        if self._nc is None:
            raise ServiceUnavailableError(
                f"the NATS plane of {redact_url(self.url)} is not connected: use DistributedRuntime.create"
            )
        return self._nc

    async def start(self) -> None:
        self._nc = await connect_nats(self.url, timeout=self.connect_timeout, closing=lambda: self._closing)
        token = self._nc.new_inbox().rsplit(".", 1)[1]
        self.control_subject = f"_DYN.ctl.{token}"
        self._inbox_prefix = f"_DYN.inbox.{token}"
        await self._nc.subscribe(f"{self.control_subject}.*", cb=self._on_control)
        await self._nc.subscribe(f"{self._inbox_prefix}.*", cb=self._on_reply)
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="dynamo_nb nats heartbeat")

    def _spawn(self, coro: Any) -> None:
        """Run a best-effort send (a STOP, a reply) in the background; a failure is logged."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("a background NATS send failed: %r", task.exception())

    # -- serving

    async def add_target(
        self, target: str, server: EndpointServer, *, static: bool = False
    ) -> dict[str, str]:
        path = server.endpoint.path
        subject = static_subject(path) if static else instance_subject(path, server.instance_id)
        sub = await self.nc.subscribe(
            subject, queue=STATIC_QUEUE_GROUP if static else "", cb=self._on_request
        )
        await self.nc.flush(
            timeout=int(self.connect_timeout) or 1
        )  # the subscription is live before we publish it
        self._targets[target] = (server, sub)
        return {"kind": "nats", "address": subject, "target": target}

    async def remove_target(self, target: str) -> None:
        entry = self._targets.pop(target, None)
        if entry is not None:
            try:
                await entry[1].unsubscribe()
            except Exception as exc:
                logger.debug("unsubscribe failed: %s", exc)

    async def _on_request(self, msg: Msg) -> None:
        reply = msg.reply
        if not reply:
            return
        try:
            frame = decode(msg.data, MAX_REQUEST_FRAME_BYTES)
            kind = frame[0]
        except Exception as exc:
            logger.warning("ignoring a malformed request on %s: %s", msg.subject, exc)
            return
        if kind == PING:
            ok = len(frame) > 2 and frame[2] in self._targets
            answer = (
                (PONG, 0) if ok else (ERROR, 0, ErrorCode.NO_INSTANCE, "InstanceNotFound", "not served here")
            )
            await self.nc.publish(reply, encode(answer))
            return
        fields = request_fields(frame) if kind == REQUEST else None
        if fields is None:
            return
        target, request_id, body, metadata = fields
        self._next += 1
        control = f"{self.control_subject}.{self._next}"
        sink = _NatsSink(self, reply, control)
        entry = self._targets.get(target)
        if entry is None:
            sink.error(ErrorCode.NO_INSTANCE, "InstanceNotFound", f"{target} is not served here")
            return
        self._streams[control] = (None, sink)
        stream = entry[0].start_stream(str(request_id), body, sink, metadata)
        if control in self._streams:
            self._streams[control] = (stream, sink)
        sink.kick()

    async def _on_control(self, msg: Msg) -> None:
        """A STOP from the caller, or NATS saying the caller's inbox is gone: stop the stream."""
        entry = self._streams.get(msg.subject)
        if entry is None or entry[0] is None:
            return
        if not _no_responders(msg):
            try:
                if decode(msg.data, MAX_REQUEST_FRAME_BYTES)[0] != STOP:
                    return
            except Exception:
                return
        entry[0].stop()

    # -- calling

    async def open_stream(
        self,
        instance: Instance,
        request_id: str,
        body: Any,
        channel: StreamChannel,
        metadata: dict[str, Any] | None = None,
    ) -> StreamHandle:
        self._next += 1
        inbox = f"{self._inbox_prefix}.{self._next}"
        try:
            payload = encode((REQUEST, 0, *request_tail(instance.target, request_id, body, metadata)))
        except (TypeError, ValueError, OverflowError) as exc:
            raise encode_request_error(exc) from None
        handle = _NatsHandle(self, inbox, channel)
        channel.last_seen = asyncio.get_running_loop().time()
        self._open[inbox] = handle
        try:
            await self.nc.publish(instance.transport.get("address", ""), payload, reply=inbox)
        except Exception as exc:
            self._open.pop(inbox, None)
            raise instance_down(instance, f"cannot publish to NATS ({type(exc).__name__}: {exc})") from None
        return handle

    async def _on_reply(self, msg: Msg) -> None:
        inbox = msg.subject
        if inbox in self._pings:
            self._answer_ping(inbox, msg)
            return
        handle = self._open.get(inbox)
        if handle is None:
            if msg.reply and not _no_responders(msg):  # a stream let go: make sure its handler stops
                self._spawn(self.nc.publish(msg.reply, encode((STOP, inbox))))
            return
        channel = handle.channel
        channel.last_seen = asyncio.get_running_loop().time()
        if _no_responders(msg):
            self._open.pop(inbox, None)
            channel.fail(f"no responders on NATS subject for {channel.instance.target} (the worker is gone)")
            return
        try:
            frames = unpack_all_bounded(msg.data)
        except Exception as exc:
            self._open.pop(inbox, None)
            channel.fail(f"bad frame from the worker: {exc}")
            return
        for frame in frames:
            kind = frame[0]
            if kind == ITEM:
                channel.push_item(frame[2])
            elif kind == END:
                self._open.pop(inbox, None)
                channel.push_end()
            elif kind == ERROR:
                self._open.pop(inbox, None)
                channel.push_error_frame(*frame[2:6])
            elif kind == ACK:
                handle.control = frame[2]
                if handle.stop_wanted:
                    handle.stop()

    def _answer_ping(self, inbox: str, msg: Msg) -> None:
        future = self._pings.pop(inbox)
        ok = not _no_responders(msg)
        if ok:
            try:
                ok = decode(msg.data)[0] == PONG
            except Exception:
                ok = False
        if not future.done():
            future.set_result(ok)

    async def ping(self, instance: Instance, timeout: float) -> bool:
        self._next += 1
        inbox = f"{self._inbox_prefix}.{self._next}"
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pings[inbox] = future
        try:
            await self.nc.publish(
                instance.transport.get("address", ""), encode((PING, 0, instance.target)), reply=inbox
            )
            return await asyncio.wait_for(future, timeout)
        except (asyncio.TimeoutError, nats.errors.Error):
            return False
        finally:
            self._pings.pop(inbox, None)

    # -- liveness

    async def _tick(self) -> None:
        async for now, stalled in liveness_ticks():
            for _stream, sink in list(self._streams.values()):
                if now - sink.last_sent >= HEARTBEAT_INTERVAL:
                    sink.heartbeat()
            for inbox, handle in list(self._open.items()):
                if stalled:  # this loop did not run: what came meanwhile is still unread
                    handle.channel.last_seen = max(handle.channel.last_seen, now - HEARTBEAT_INTERVAL)
                elif now - handle.channel.last_seen > self.heartbeat_timeout:
                    # a worker that is alive but stalled stops too: the request may go on elsewhere
                    handle.stop()
                    self._open.pop(inbox, None)
                    handle.channel.fail(f"no frames or heartbeats for {self.heartbeat_timeout:g} s")

    async def close(self) -> None:
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
        for inbox, handle in list(self._open.items()):
            self._open.pop(inbox, None)
            handle.channel.fail("the runtime shut down")
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.close(), 3.0)
            except Exception as exc:
                logger.debug("closing NATS failed: %s", exc)
        for task in list(self._tasks):
            task.cancel()
