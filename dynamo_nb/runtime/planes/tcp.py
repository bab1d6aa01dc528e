"""The TCP request plane: length-prefixed msgpack frames, many streams over one connection.

The worker listens on a free port (``tcp_host``) and advertises ``advertise_host:port`` in
discovery (`dynamo_nb.runtime.addresses` picks both). A client keeps one connection per worker address and
multiplexes its streams on it by stream id. With a cluster secret a connection starts with the
keyed handshake, with TLS files it is TLS (`dynamo_nb.runtime.security`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, cast

from ...errors import AuthenticationError, ConfigError, ProtocolError
from ..addresses import host_port
from ..instance import Instance
from ..security import (
    HANDSHAKE_TIMEOUT,
    TCP_PLANE,
    ClientHandshake,
    PlaneSecurity,
    ServerHandshake,
    current_security,
    without_secret_hint,
)
from .base import (
    HEARTBEAT_INTERVAL,
    RequestPlane,
    StreamHandle,
    encode_request_error,
    instance_down,
    liveness_ticks,
    set_nodelay,
)
from .channel import StreamChannel
from .wire import (
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
    FrameDecoder,
    encode_prefixed,
    error_frame,
    request_fields,
    request_tail,
)

if TYPE_CHECKING:
    from ..server import EndpointServer, ServerStream

__all__ = ["TcpPlane", "parse_tcp_address"]

logger = logging.getLogger("dynamo_nb.planes.tcp")

CONNECT_TIMEOUT = 3.0


def parse_tcp_address(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` or ``HOST:PORT`` → (host, port).

    Example:
        >>> parse_tcp_address("tcp://127.0.0.1:9000")
        ('127.0.0.1', 9000)
    """
    text = address[len("tcp://") :] if address.startswith("tcp://") else address
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"invalid TCP address {address!r}: expected 'tcp://HOST:PORT', e.g. tcp://127.0.0.1:9000"
        )
    return host.strip("[]"), int(port)


# ----------------------------------------------------------------------------- server side


class _TcpSink:
    """Frames of one server stream onto its connection."""

    __slots__ = ("conn", "sid")

    def __init__(self, conn: _ServerConnection, sid: int) -> None:
        self.conn = conn
        self.sid = sid

    def item(self, data: Any) -> None:
        self.conn.send(encode_prefixed((ITEM, self.sid, data)))

    def end(self) -> None:
        self.conn.send(encode_prefixed((END, self.sid)))
        self.conn.streams.pop(self.sid, None)

    def error(self, code: str, error_type: str, message: str, details: dict[str, Any] | None = None) -> None:
        self.conn.send(encode_prefixed(error_frame(self.sid, code, error_type, message, details)))
        self.conn.streams.pop(self.sid, None)

    def congested(self) -> bool:
        return self.conn.paused

    async def drain(self) -> None:
        await self.conn.wait_writable()


class _CoalescingConnection(asyncio.Protocol):
    """A connection whose frames queued in one loop iteration go out in one write (one
    syscall: on loopback the kernel runs the receiver's TCP path inside each send)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.last_sent = 0.0
        self._pending: list[bytes] = []
        self._flush_scheduled = False

    def send(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration goes out in one write."""
        self._pending.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.transport is None or self.transport.is_closing():
            self._pending.clear()
            return
        pending, self._pending = self._pending, []
        self.transport.write(b"".join(pending) if len(pending) > 1 else pending[0])
        self.last_sent = self.loop.time()


class _ServerConnection(_CoalescingConnection):
    """One client connection to this worker's listener."""

    def __init__(self, plane: TcpPlane) -> None:
        super().__init__()
        self.plane = plane
        self.decoder = FrameDecoder(MAX_REQUEST_FRAME_BYTES)
        self.streams: dict[int, ServerStream] = {}
        self.paused = False
        self._writable: asyncio.Future[None] | None = None
        secret = plane.security.secret
        self.handshake = (
            ServerHandshake(secret, TCP_PLANE, plane.advertised_address) if secret is not None else None
        )
        self._handshake_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = stream = cast(asyncio.Transport, transport)  # a stream server's transport
        set_nodelay(transport)
        self.plane._server_conns.add(self)
        if self.handshake is not None:
            stream.write(self.handshake.hello())
            self._handshake_timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._refuse, "no handshake")

    def _refuse(self, why: str) -> None:
        if self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            logger.warning("refused a connection from %s: %s", peer, why)
            self.transport.close()

    def _authenticate(self, data: bytes) -> bytes | None:
        """Feed the handshake; the bytes after it once the peer is proven, else None."""
        assert self.handshake is not None and self.transport is not None
        try:
            result = self.handshake.feed(data)
        except AuthenticationError as exc:
            self._refuse(str(exc))
            return None
        if result is None:
            return None
        proof, rest = result
        self.handshake = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.transport.write(proof)
        return rest

    def data_received(self, data: bytes) -> None:
        if self.handshake is not None:
            rest = self._authenticate(data)
            if not rest:
                return
            data = rest
        try:
            frames = self.decoder.feed(data)
        except Exception as exc:
            logger.warning("closing a connection that sent a bad frame: %s", exc)
            if self.transport is not None:
                self.transport.close()
            return
        for frame in frames:
            try:
                self._dispatch(frame)
            except Exception as exc:  # a frame of the right shape with values of the wrong types
                logger.warning("closing a connection that sent a malformed frame: %r", exc)
                if self.transport is not None:
                    self.transport.close()
                return

    def _dispatch(self, frame: Any) -> None:
        """Act on one frame; a frame of the wrong shape raises (the connection is then closed)."""
        if not isinstance(frame, (list, tuple)) or len(frame) < 2:
            raise ProtocolError(f"a frame must be a list [kind, stream id, ...], got {frame!r:.80}")
        kind, sid = frame[0], frame[1]
        if kind == REQUEST:
            fields = request_fields(frame)
            if fields is None:
                raise ProtocolError(f"a request frame has 5 or 6 fields, got {len(frame)}")
            target, request_id, body, metadata = fields
            sink = _TcpSink(self, sid)
            server = self.plane.targets.get(target)
            if server is None:
                sink.error(ErrorCode.NO_INSTANCE, "InstanceNotFound", f"{target} is not served here")
                return
            stream = server.start_stream(str(request_id), body, sink, metadata)
            if stream is not None:
                self.streams[sid] = stream
        elif kind == STOP:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.stop()
        elif kind == PING:
            if len(frame) > 2 and frame[2] in self.plane.targets:
                self.send(encode_prefixed((PONG, sid)))
            else:
                self.send(
                    encode_prefixed(
                        (ERROR, sid, ErrorCode.NO_INSTANCE, "InstanceNotFound", "not served here")
                    )
                )

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def wait_writable(self) -> None:
        if self.paused:
            if self._writable is None:
                self._writable = self.loop.create_future()
            await asyncio.shield(self._writable)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.plane._server_conns.discard(self)
        streams, self.streams = self.streams, {}
        for stream in streams.values():  # the caller is gone: stop its handlers
            stream.stop()
        self.resume_writing()


# ----------------------------------------------------------------------------- client side


class _TcpHandle:
    __slots__ = ("conn", "sid")

    def __init__(self, conn: _ClientConnection, sid: int) -> None:
        self.conn = conn
        self.sid = sid

    def stop(self) -> None:
        if self.sid in self.conn.streams:
            self.conn.write(encode_prefixed((STOP, self.sid)))

    def release(self) -> None:
        self.conn.streams.pop(self.sid, None)


class _ClientConnection(_CoalescingConnection):
    """This process's connection to one worker address."""

    def __init__(self, plane: TcpPlane, address: str) -> None:
        super().__init__()
        self.plane = plane
        self.address = address
        self.decoder = FrameDecoder()
        self.streams: dict[int, StreamChannel] = {}
        self.pings: dict[int, asyncio.Future[bool]] = {}
        self.next_sid = 1
        self.closed = False
        self.last_seen = self.loop.time()
        secret = plane.security.secret
        self.handshake = (
            ClientHandshake(secret, TCP_PLANE, host_port(*parse_tcp_address(address)))
            if secret is not None
            else None
        )
        self.ready: asyncio.Future[None] = self.loop.create_future()  # the server is proven
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read by _connect
        if self.handshake is None:
            self.ready.set_result(None)
        self._received = False
        self.failure: Exception | None = None  # why it closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport is an asyncio.Transport
        set_nodelay(transport)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.send(data)  # with the other frames of this loop iteration

    def open(self, channel: StreamChannel, frame_tail: tuple[Any, ...]) -> _TcpHandle:
        """Send a REQUEST frame for ``channel``; raises `ConnectionError` when this connection has
        closed (it may close after its connect returned and before its caller resumed: a stream
        registered then would wait for an answer that never comes)."""
        if self.closed:
            raise ConnectionError(str(self.failure or f"connection to {self.address} closed"))
        sid = self.next_sid
        self.next_sid += 1
        data = encode_prefixed((REQUEST, sid, *frame_tail))
        if not self.streams:
            self.last_seen = self.loop.time()
        self.streams[sid] = channel
        self.write(data)
        return _TcpHandle(self, sid)

    def ping(self, target: str) -> asyncio.Future[bool]:
        sid = self.next_sid
        self.next_sid += 1
        future: asyncio.Future[bool] = self.loop.create_future()
        if self.closed:  # nobody would answer it
            future.set_result(False)
            return future
        self.pings[sid] = future
        self.write(encode_prefixed((PING, sid, target)))
        return future

    def data_received(self, data: bytes) -> None:
        self.last_seen = self.loop.time()
        first, self._received = not self._received, True
        if self.handshake is not None:
            try:
                answer, done, data = self.handshake.feed(data)
            except AuthenticationError as exc:
                self.abort(f"{self.address}: {exc}", exc)
                return
            self.write(answer)
            if not done:
                return
            self.handshake = None
            self.ready.set_result(None)
            if not data:
                return
        try:
            frames = self.decoder.feed(data)
        except Exception as exc:
            hint = without_secret_hint(data) if first else None
            if hint is not None:
                self.abort(f"{self.address}: {hint}", AuthenticationError(hint))
            else:
                self.abort(f"bad frame from the worker: {exc}")
            return
        streams = self.streams
        for frame in frames:
            kind, sid = frame[0], frame[1]
            if kind == ITEM:
                channel = streams.get(sid)
                if channel is not None:
                    channel.push_item(frame[2])
            elif kind == END:
                channel = streams.pop(sid, None)
                if channel is not None:
                    channel.push_end()
            elif kind == ERROR:
                channel = streams.pop(sid, None)
                if channel is not None:
                    channel.push_error_frame(*frame[2:6])
                elif sid in self.pings:
                    self._answer_ping(sid, False)
            elif kind == PONG:
                self._answer_ping(sid, True)
            # HEARTBEAT: last_seen is enough

    def _answer_ping(self, sid: int, ok: bool) -> None:
        future = self.pings.pop(sid, None)
        if future is not None and not future.done():
            future.set_result(ok)

    def abort(self, reason: str, error: Exception | None = None) -> None:
        """Close now; streams fail with ``reason``, a connect waiting on the handshake with
        ``error`` (default: a `ConnectionError`)."""
        if self.transport is not None:
            self.transport.abort()
        self._fail_all(reason, error)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handshake is not None and self.handshake.answered:
            reason = (
                f"{self.address} closed the connection after our handshake: it holds a different cluster "
                "secret, or advertises another address than the one dialed"
            )
            self._fail_all(reason, AuthenticationError(reason))
            return
        self._fail_all(f"connection to {self.address} lost" + (f" ({exc})" if exc else ""))

    def _fail_all(self, reason: str, error: Exception | None = None) -> None:
        if self.closed:  # the first reason stands (an abort, then its connection_lost)
            return
        self.failure = error or ConnectionError(reason)
        if not self.ready.done():
            self.ready.set_exception(self.failure)
        self.closed = True
        self.plane._forget(self)
        streams, self.streams = self.streams, {}
        for channel in streams.values():
            channel.fail(reason)
        pings, self.pings = self.pings, {}
        for future in pings.values():
            if not future.done():
                future.set_result(False)


# ----------------------------------------------------------------------------- the plane


class TcpPlane(RequestPlane):
    """Request plane over TCP.

    Example::

        rt = await DistributedRuntime.create(discovery=services.etcd_url, request_plane="tcp")
    """

    name = "tcp"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        heartbeat_timeout: float = 5.0,
        advertise_host: str | None = None,
        security: PlaneSecurity | None = None,
    ) -> None:
        super().__init__(heartbeat_timeout=heartbeat_timeout)
        self.security = security if security is not None else current_security()
        self.host = host
        self.port = port
        self.advertise_host = advertise_host or host
        self.targets: dict[str, EndpointServer] = {}
        self._listener: asyncio.AbstractServer | None = None
        self._listen_lock = asyncio.Lock()
        self._server_conns: set[_ServerConnection] = set()
        self._conns: dict[str, _ClientConnection] = {}
        self._connecting: dict[str, asyncio.Task[_ClientConnection]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def advertised_address(self) -> str:
        """``host:port`` clients connect to, as discovery has it (after the first `add_target`)."""
        return host_port(self.advertise_host, self.port)

    async def _ensure_listening(self) -> None:
        async with self._listen_lock:
            if self._listener is not None:
                return
            self.security.check_listener(self.host, "the TCP request plane")
            loop = asyncio.get_running_loop()
            try:
                self._listener = await loop.create_server(
                    lambda: _ServerConnection(self),
                    self.host,
                    self.port,
                    reuse_address=True,
                    ssl=self.security.server_ssl(),
                )
            except OSError as exc:
                raise ConfigError(
                    f"cannot listen on tcp://{self.host}:{self.port} ({exc}); choose another tcp_port or 0 for a free one"
                ) from exc
            self.port = self._listener.sockets[0].getsockname()[1]
            self._start_ticker()

    def _start_ticker(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(
                self._tick(), name="dynamo_nb tcp heartbeat"
            )

    async def _tick(self) -> None:
        """Heartbeats out on busy-but-silent connections; give up on silent ones we wait on
        (not right after this loop stalled: what they sent meanwhile is still unread)."""
        async for now, stalled in liveness_ticks():
            for served in list(self._server_conns):
                if served.streams and now - served.last_sent >= HEARTBEAT_INTERVAL:
                    served.send(encode_prefixed((HEARTBEAT, 0)))
            for conn in list(self._conns.values()):
                if stalled:
                    conn.last_seen = max(conn.last_seen, now - HEARTBEAT_INTERVAL)
                elif conn.streams and now - conn.last_seen > self.heartbeat_timeout:
                    conn.abort(
                        f"no frames or heartbeats from {conn.address} for {self.heartbeat_timeout:g} s"
                    )

    async def add_target(
        self, target: str, server: EndpointServer, *, static: bool = False
    ) -> dict[str, str]:
        await self._ensure_listening()
        self.targets[target] = server
        return {"kind": "tcp", "address": self.advertised_address, "target": target}

    async def remove_target(self, target: str) -> None:
        self.targets.pop(target, None)

    async def _connection(self, instance: Instance) -> _ClientConnection:
        address = instance.transport.get("address", "")
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._connect(address))
            self._connecting[address] = pending
            pending.add_done_callback(functools.partial(self._connect_done, address))
        try:
            return await asyncio.shield(pending)
        except (OSError, asyncio.TimeoutError, ConfigError, AuthenticationError) as exc:
            raise instance_down(
                instance, f"cannot connect to tcp://{address} ({type(exc).__name__}: {exc})"
            ) from None

    def _connect_done(self, address: str, task: asyncio.Task[_ClientConnection]) -> None:
        """A connect attempt ended. Its failure is read here too: every caller awaiting it may
        have given up (cancelled), and a failure nobody reads is logged as an error by asyncio."""
        self._connecting.pop(address, None)
        if not task.cancelled():
            task.exception()

    async def _connect(self, address: str) -> _ClientConnection:
        host, port = parse_tcp_address(address)
        loop = asyncio.get_running_loop()
        tls = self.security.client_ssl()
        _transport, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: _ClientConnection(self, address),
                host,
                port,
                ssl=tls,
                server_hostname=host if tls else None,
            ),
            CONNECT_TIMEOUT,
        )
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready), CONNECT_TIMEOUT)
        except asyncio.TimeoutError:
            conn.abort("no handshake")
            raise AuthenticationError(
                f"{address} did not start the cluster-secret handshake within {CONNECT_TIMEOUT:g} s: it runs "
                "without the secret (or is not a dynamo_nb worker)"
            ) from None
        if conn.closed:  # e.g. its first bytes asked for a secret this process lacks
            raise conn.failure or ConnectionError(f"connection to {address} closed at once")
        if self._closed:  # closed while this connection was being made
            conn.abort("the runtime shut down")
            raise ConnectionError("the runtime shut down")
        self._conns[address] = conn
        self._start_ticker()
        return conn

    def _forget(self, conn: _ClientConnection) -> None:
        if self._conns.get(conn.address) is conn:
            del self._conns[conn.address]

    async def open_stream(
        self,
        instance: Instance,
        request_id: str,
        body: Any,
        channel: StreamChannel,
        metadata: dict[str, Any] | None = None,
    ) -> StreamHandle:
        conn = await self._connection(instance)
        try:
            return conn.open(channel, request_tail(instance.target, request_id, body, metadata))
        except ConnectionError as exc:
            raise instance_down(instance, str(exc)) from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise encode_request_error(exc) from None

    async def ping(self, instance: Instance, timeout: float) -> bool:
        try:
            conn = await self._connection(instance)
            return await asyncio.wait_for(conn.ping(instance.target), timeout)
        except (ConnectionError, asyncio.TimeoutError):
            return False

    async def close(self) -> None:
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        for conn in list(self._conns.values()):
            conn.abort("the runtime shut down")
        if self._listener is not None:
            self._listener.close()
            for served in list(self._server_conns):
                if served.transport is not None:
                    served.transport.close()
            try:
                await asyncio.wait_for(self._listener.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
