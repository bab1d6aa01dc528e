"""A small HTTP/1.1 server on asyncio's protocols: the frontend's listener.

One `HttpConnection` per TCP connection reads requests (`parser`), runs each in its own task
(one at a time per connection, pipelined requests in order) and writes its answer. What it
guards against, with the limits of a `ConnectionGuard`:

- a connection whose first request's head is not in within ``header_timeout`` is closed
  (a slowloris), and so is one whose body stalls for ``idle_timeout``;
- a keep-alive connection idle for ``idle_timeout`` between requests is closed;
- beyond ``max_connections`` a new connection gets a 503 in OpenAI's envelope and is closed;
- a body over ``max_body`` bytes is a 413, a head over 64 KiB a 431;
- a client that leaves cancels its request's task at once (the worker's stream with it), and
  a client that stops reading holds a write for at most ``idle_timeout``.

Unknown paths are 404s, known paths with another method 405s (``HEAD`` is served where
``GET`` is), all in OpenAI's error envelope.

Example::

    async def live(request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live"})

    server = HttpServer({"/live": {"GET": live}}, ConnectionGuard(), idle_timeout=60)
    await server.start("127.0.0.1", 0)
    server.port          # the port it listens on
    await server.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .connections import ConnectionGuard
from .messages import HttpRequest, HttpResponse, StreamedResponse, json_response
from .parser import HttpError, RequestHead, RequestParser

__all__ = ["Handler", "HttpConnection", "HttpServer"]

logger = logging.getLogger("dynamo_nb.http")

Handler = Callable[[HttpRequest], Awaitable["HttpResponse | StreamedResponse"]]
"""A route's handler: the request in, its answer out."""

ErrorBody = Callable[[int, str], Any]
"""The JSON body of an error the server answers itself (status, message → body): an app hands
its own envelope (the frontend, OpenAI's)."""


def plain_error_body(status: int, message: str) -> dict[str, Any]:
    """The default error body: ``{"error": {"message": ..., "code": status}}``.

    Example:
        >>> plain_error_body(404, "no route GET /x")
        {'error': {'message': 'no route GET /x', 'code': 404}}
    """
    return {"error": {"message": message, "code": status}}


_READ_AHEAD = 1 << 20  # bytes held for the next requests while one is served, before reading pauses
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"
_LINGER = 2.0  # seconds a refused client has to read its answer
BACKLOG = 1024
"""Connections the kernel queues before they are accepted (asyncio's default, 100, drops the
SYNs of a burst of new connections: each waits a second for its retry)."""


class HttpServer:
    """Routes (``{path: {method: handler}}``) served over HTTP/1.1 on one listening socket.

    Args:
        routes: the handlers by path and method.
        guard: the header timeout and connection cap, and their counters.
        idle_timeout: seconds a keep-alive connection may idle between requests (and a body
            stall, and a write wait on a client that does not read).
        max_body: the largest request body taken, in bytes.
        error_body: the JSON body of the errors the server answers itself (404, 413, 503 …).
        name: what the server is, in its own error messages ("the frontend").
    """

    def __init__(
        self,
        routes: Mapping[str, Mapping[str, Handler]],
        guard: ConnectionGuard,
        *,
        idle_timeout: float = 60.0,
        max_body: int = 32 * 1024 * 1024,
        error_body: ErrorBody = plain_error_body,
        name: str = "the server",
    ) -> None:
        self.routes = routes
        self.error_body = error_body
        self.name = name
        self.guard = guard
        self.idle_timeout = idle_timeout
        self.max_body = max_body
        self.connections: set[HttpConnection] = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._emptied: asyncio.Event | None = None  # set when the last connection is gone (stop)
        self.loop_time: Callable[[], float] = time.monotonic
        self.loop: asyncio.AbstractEventLoop | None = None  # kept: asking is a getpid system call (3.11)
        self.port = 0

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        """Listen on ``host:port`` (port 0: a free one, then in `port`)."""
        loop = self.loop = asyncio.get_running_loop()
        self.loop_time = loop.time
        self._server = await loop.create_server(
            lambda: HttpConnection(self),
            host,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            backlog=BACKLOG,
        )
        self.port = self._server.sockets[0].getsockname()[1] if self._server.sockets else port
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Every quarter of the shortest timeout (at most a second), end the waits that ran out."""
        period = min(1.0, self.guard.header_timeout / 4, self.idle_timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = self.loop_time()
            for connection in [c for c in self.connections if 0 < c.deadline <= now]:
                connection.deadline = 0.0
                try:
                    connection.on_deadline()
                except Exception:  # the sweep goes on for the others
                    logger.exception("closing a timed-out connection failed")

    async def stop(self, grace: float = 1.0) -> None:
        """Stop listening, let requests under way finish for ``grace`` seconds, cancel the rest
        and close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
            self._server = None
        busy = [c.task for c in self.connections if c.task is not None]
        for connection in list(self.connections):
            if connection.task is None:
                connection.close()
        if busy:
            _, pending = await asyncio.wait(busy, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=grace)
        for connection in list(self.connections):
            connection.close()
        if self.connections:  # the answers written go out, to clients that read them
            self._emptied = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), grace)
        for connection in list(self.connections):
            connection.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def forget(self, connection: HttpConnection) -> None:
        """``connection`` is closed."""
        self.connections.discard(connection)
        if self._emptied is not None and not self.connections:
            self._emptied.set()

    def route(self, method: str, path: str) -> Handler:
        """The handler of ``method`` on ``path``; an `HttpError` (404, 405) when none."""
        methods = self.routes.get(path)
        if methods is None:
            raise HttpError(404, f"no route {method} {path}: see {', '.join(self.routes)}")
        handler = methods.get(method)
        if handler is None and method == "HEAD":
            handler = methods.get("GET")
        if handler is None:
            error = HttpError(405, f"{method} is not allowed on {path}")
            error.allow = sorted({*methods, "HEAD"} if "GET" in methods else methods)
            raise error
        return handler

    def error_response(self, exc: HttpError) -> HttpResponse:
        """A request the server refuses, in the app's error envelope."""
        headers = {"Allow": ", ".join(exc.allow)} if exc.allow else None
        body = self.error_body(exc.http_status, str(exc))
        return json_response(body, status=exc.http_status, headers=headers)


class HttpConnection(asyncio.Protocol):
    """One client connection: its requests read, served one at a time, answered in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = RequestParser(server.max_body, on_head=self._head_read)
        self.waiting: deque[HttpRequest | HttpError] = deque()  # read, in order; an error ends them
        self.read_ahead = 0  # bytes received while requests were served or waiting
        self.task: asyncio.Task[None] | None = None  # the request being served
        self.deadline = 0.0  # the loop time the pending wait ends at (0: none); the server's sweep checks it
        self.on_deadline: Callable[[], None] = self.abort
        self.counted = False
        self.closed = False
        self.discarding = False  # refused: what the client still sends is dropped
        self.reading_paused = False
        self.write_paused = False
        self.started = False  # the current answer's first bytes went out
        self._drain: asyncio.Future[None] | None = None

    # -- asyncio.Protocol

    @property
    def peer(self) -> str:
        """The client's address, ``host:port``."""
        address = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else "?"

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        guard = self.server.guard
        if guard.open >= guard.max_connections or self.server.stopping:
            guard.refused_total += 1
            refused = self.server.error_body(
                503, f"{self.server.name} has too many open connections; retry later"
            )
            response = json_response(refused, status=503, headers={"Retry-After": "1"})
            transport.write(response.encode(_CLOSE))
            transport.close()
            self.closed = True
            return
        guard.open += 1
        self.counted = True
        self.server.connections.add(self)
        self._time(guard.header_timeout, self._slow)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.discarding:
            return
        if self.task is not None or self.waiting:
            self.read_ahead += len(data)
        parser = self.parser
        refused: HttpError | None = None
        try:
            parser.feed(data)
        except HttpError as exc:
            self.discarding = True  # what follows the malformed request is never read
            refused = exc
        while parser.ready:  # the requests read before a malformed one are answered first
            head, body = parser.ready.popleft()
            self.waiting.append(
                HttpRequest(
                    self,
                    head.method,
                    head.path,
                    head.query,
                    head.version,
                    head.headers,
                    body,
                    head.keep_alive,
                )
            )
        if refused is not None:
            self.waiting.append(refused)
        if self.task is None:
            if self.waiting and not self.write_paused:
                self._next()
        elif self.read_ahead > _READ_AHEAD and not self.reading_paused:  # the next ones wait
            self.reading_paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]  # data_received runs only while connected

    def eof_received(self) -> bool:
        """The client closed its side: taken as the client gone (a request under way is
        cancelled at once), since a closed socket and a half-closed one look alike from here."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._untime()
        if self.counted:
            self.counted = False
            self.server.guard.open -= 1
            self.server.forget(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its request stops (the worker's stream with it)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        elif self.task is None and self.waiting and not self.closed:
            self._next()  # a pipelined request waited for the client to read the last answer

    # -- writing

    def send(self, data: bytes) -> None:
        """Write ``data`` to the client; `ConnectionResetError` once it left."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.started = True
        self.transport.write(data)

    async def drained(self) -> None:
        """Wait until the client read enough of what was written (at most the idle timeout)."""
        if not self.write_paused:
            return
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._drain, self.server.idle_timeout)
        except asyncio.TimeoutError:
            self.abort()
            raise ConnectionResetError(
                f"the client read nothing for {self.server.idle_timeout} s; closed"
            ) from None

    def close(self) -> None:
        """Close once what was written is sent: a client that does not read it within the idle
        timeout is cut off (the connection never lingers)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        if not self.closed:
            self._time(self.server.idle_timeout, self.abort)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- timers

    def _time(self, seconds: float, then: Callable[[], None]) -> None:
        """Call ``then`` if nothing else is timed within ``seconds`` (one timer for all
        connections, the server's sweep: cheaper than a timer per request)."""
        self.deadline = self.server.loop_time() + seconds
        self.on_deadline = then

    def _untime(self) -> None:
        self.deadline = 0.0

    def _slow(self) -> None:
        """The head (first request) or a body did not come in time."""
        if not self.closed:
            self.server.guard.timed_out_total += 1
            self.abort()

    def _idle(self) -> None:
        if self.task is None:
            self.close()

    # -- reading

    def _head_read(self, head: RequestHead) -> None:
        """A head is read: a body no route takes is refused now, before it is read (404, 405);
        else it must follow within the idle timeout (answered ``100 Continue`` first when the
        client waits for it)."""
        if head.chunked or head.content_length:
            self.server.route(head.method, head.path)
        if self.task is None and not self.waiting and not self.parser.ready:  # (never inside another answer)
            self._time(self.server.idle_timeout, self._slow)
            if head.expect_continue and (head.chunked or head.content_length):
                self.transport.write(_CONTINUE)  # type: ignore[union-attr]  # not the answer: no `send`

    def _next(self) -> None:
        """Serve the next request read (or refuse the malformed one)."""
        request = self.waiting.popleft()
        if isinstance(request, HttpError):
            self._refuse(request)
            return
        self._untime()
        self.task = (self.server.loop or asyncio.get_running_loop()).create_task(self._serve(request))

    def _refuse(self, exc: HttpError) -> None:
        """Answer a request that could not be read, and close once the client had time to
        read the answer: what it still sends meanwhile is dropped (a lingering close), so a
        client still sending a body too large sees the 413 rather than a reset."""
        self.discarding = True
        self.waiting.clear()
        if not self.closed and not self.started:
            try:
                self.send(self.server.error_response(exc).encode(_CLOSE))
            except ConnectionResetError:
                pass
        transport = self.transport
        if transport is not None and not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()
            self._time(_LINGER, self.abort)
        else:
            self.close()

    # -- serving

    async def _serve(self, request: HttpRequest) -> None:
        response: HttpResponse | StreamedResponse
        try:
            try:
                response = await self.server.route(request.method, request.path)(request)
            except HttpError as exc:
                response = self.server.error_response(exc)
            if isinstance(response, StreamedResponse):
                await response.write_eof()
            elif self.started:  # an answer in the middle of a stream under way: cut it short
                logger.warning(
                    "%s %s: an answer after the stream had started; closed", request.method, request.path
                )
                self.abort()
                return
            else:
                await self._send_whole(request, response)
        except asyncio.CancelledError:
            self.abort()
            raise
        except ConnectionResetError:
            self.abort()
            return
        except Exception:
            logger.exception("internal error on %s %s", request.method, request.path)
            if self.started:  # the answer is under way: the client sees it cut short
                self.abort()
                return
            body = self.server.error_body(500, f"internal error in {self.server.name}; see its log")
            try:
                await self._send_whole(request, json_response(body, status=500))
            except ConnectionResetError:
                return
        finally:
            self.task = None
        self._done(request)

    async def _send_whole(self, request: HttpRequest, response: HttpResponse) -> None:
        """``response`` in one write (its head alone for ``HEAD``), waited on while the client reads."""
        self.send(response.encode(self.connection_header(request), head_only=request.method == "HEAD"))
        await self.drained()

    def closing(self, request: HttpRequest) -> bool:
        """Whether the connection closes after ``request``'s answer."""
        return not request.keep_alive or self.server.stopping

    def connection_header(self, request: HttpRequest) -> bytes:
        """The answer's ``Connection`` line: ``close``, ``keep-alive`` for an HTTP/1.0 client
        that asked for it, else none (HTTP/1.1 keeps connections by default)."""
        if self.closing(request):
            return _CLOSE
        return _KEEP_ALIVE if request.version == "1.0" else b""

    def _done(self, request: HttpRequest) -> None:
        """The answer is out: close, or wait for the next request."""
        self.started = False
        if self.closed:
            return
        if self.closing(request):
            self.close()
            return
        if not self.waiting:
            self.read_ahead = 0
            if self.reading_paused:
                self.reading_paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]  # paused only while connected
        self._time(self.server.idle_timeout, self._idle)
        if self.waiting and not self.write_paused:  # else once the client read the last answer
            self._next()
