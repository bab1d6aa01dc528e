"""`LeanHttpClient`: the load generator's HTTP/1.1 client, small because it shares the machine.

A load generator on the machine it measures takes its CPU from the servers under test: with
aiohttp's client, `run` spent about half a millisecond per 32-token stream, some 40 % of this
2-core machine at full load. This client does only what the load generator needs: POST a body
(or GET), read the head, and hand the body over as it arrives, de-chunked. Connections are kept
alive and reused (or one per request, ``new_connection=True``, sending ``Connection: close``
as aiohttp does then); ``https://`` goes through the event loop's TLS. No redirects, cookies,
proxies or compression: a benchmark wants none of them.

A connection that was reused and closes before any byte of its answer (the server's idle
timeout met our request on the wire) is retried once on a new connection, as browsers do.
Every wait is bounded by the caller: `dynamo_nb.bench.http_client.send_request` puts one timer
around a whole request, its body included.

Example::

    async with LeanHttpClient() as client:
        answer = await client.request("POST", "http://127.0.0.1:8000/v1/completions", body)
        async for piece in answer:
            ...
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from urllib.parse import urlsplit

import httptools

from ..errors import ConfigError, DynamoNBError
from .parser import MAX_HEAD_BYTES

__all__ = ["HttpAnswer", "LeanHttpClient", "ServerAnswerError", "SocketFactory", "fetch"]

SocketFactory = Callable[[], socket.socket]
"""Makes the TCP socket a connection starts from (such as one in another network namespace:
`dynamo_nb.testing.hosts.Host.socket`)."""

_PAUSE_ABOVE = 1 << 20  # body bytes not yet read by the caller before reading pauses


class ServerAnswerError(DynamoNBError, ConnectionError):
    """The server's answer could not be read: the connection closed early or the bytes are not
    HTTP/1.1.

    Example:
        >>> str(ServerAnswerError("the server closed the connection before its answer's head"))
        "the server closed the connection before its answer's head"
    """


class HttpAnswer:
    """An answer's status and headers, and its body as it arrives.

    Iterate for the body's pieces as they come (each piece joins what arrived since the last
    one); `read` gives the whole body.

    Attributes:
        status: the status code; headers: lower-case names, a repeated header's values
            joined with ", ".
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, reading: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._loop = loop
        self._reading = reading
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None

    def _push(self, data: bytes) -> None:
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_ABOVE:
            self._reading.pause()
        self._wake()

    def _finish(self, error: BaseException | None = None) -> None:
        if not self._done:
            self._done = True
            self._error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while not self._pieces:
            if self._done:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            await self._waiter
            self._waiter = None
        pieces, self._pieces = self._pieces, []
        if self._buffered > _PAUSE_ABOVE:
            self._reading.resume()
        self._buffered = 0
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def read(self) -> bytes:
        """The whole body (what is left of it)."""
        return b"".join([piece async for piece in self])

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line as it arrives, each with its ``\\n`` (the last one may have
        none): server-sent events read as they come."""
        rest = b""
        async for piece in self:
            rest += piece
            *whole, rest = rest.split(b"\n")
            for line in whole:
                yield line + b"\n"
        if rest:
            yield rest

    def close(self) -> None:
        """Stop reading: a body not read to its end closes its connection."""
        if not self._done:
            self._reading.abort("the answer was closed before its end")


class _Connection(asyncio.Protocol):
    """One connection: writes a request, reads its answer (by llhttp, through `httptools`): the
    head, then the body as it arrives, de-chunked."""

    def __init__(self, client: LeanHttpClient, key: tuple[str, int, bool]) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self._answer: HttpAnswer | None = None
        self._head: asyncio.Future[HttpAnswer] | None = None
        self._headers: dict[str, str] = {}
        self._head_bytes = 0  # of the head not yet read (interim answers' included)
        self._got_bytes = False
        self._keep_alive = False
        self._until_close = False  # the body ends with the connection (no length, not chunked)
        self._complete = False  # the answer's end was read in this feed
        self._extra = False  # bytes after the answer's end: the connection is not reused

    # --- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport is an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self._answer is None:  # bytes nobody asked for: the connection is not HTTP we know
            self.abort("the server sent bytes before a request")
            return
        self._got_bytes = True
        if self._head is not None:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
            if self._head is not None and self._head_bytes > MAX_HEAD_BYTES:
                raise ServerAnswerError(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes")
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, ServerAnswerError) as exc:
            self.abort(f"the server's answer is not HTTP/1.1: {exc}")
            return
        if self._complete:
            self._end()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client._forget(self)
        answer = self._answer
        if answer is None:
            return
        if self._head is not None:  # no head yet
            why = "the server closed the connection before its answer's head"
            error = ServerAnswerError(f"{why} ({exc})" if exc else why)
            if not self._head.done():
                self._head.set_exception(error)
        elif self._until_close:
            answer._finish()  # a body that ends with the connection
        else:
            answer._finish(ServerAnswerError("the server closed the connection before its answer's end"))
        self._answer = None

    # --- llhttp's callbacks (httptools calls them by these names)

    def on_message_begin(self) -> None:
        if self._answer is None or self._complete:
            self._extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        headers[key] = headers[key] + ", " + text if key in headers else text

    def on_headers_complete(self) -> None:
        headers, self._headers = self._headers, {}
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer: the real one follows
            return
        answer, head = self._answer, self._head
        if answer is None or head is None:
            return
        answer.status, answer.headers = status, headers
        self._keep_alive = self._parser.should_keep_alive()
        self._until_close = (
            status not in (204, 304)
            and "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )
        self._head = None
        if not head.done():
            head.set_result(answer)

    def on_body(self, piece: bytes) -> None:
        if self._answer is not None and not self._complete:
            self._answer._push(piece)

    def on_message_complete(self) -> None:
        if self._head is None:  # not an interim answer's end
            self._complete = True

    # --- used by the client and the answer

    def start(self, request: bytes, answer: HttpAnswer) -> asyncio.Future[HttpAnswer]:
        """Send ``request``; the returned future holds ``answer`` once its head is read."""
        assert self.transport is not None
        self._answer = answer
        self._got_bytes = self._complete = False
        self._head_bytes = 0
        self._head = answer._loop.create_future()
        self.transport.write(request)
        return self._head

    def abort(self, why: str) -> None:
        error = ServerAnswerError(why)
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head = None
        if self._answer is not None:
            self._answer._finish(error)
            self._answer = None
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _end(self) -> None:
        answer, self._answer = self._answer, None
        self._complete = False
        assert answer is not None
        answer._finish()
        if self._keep_alive and not self._extra and not self.client.new_connection:
            self.client._release(self)
        elif self.transport is not None:
            self.transport.close()


def _header_lines(headers: Mapping[str, str] | None) -> str:
    """``Name: value\\r\\n`` lines; a line break inside one would start a header of its own."""
    lines = []
    for name, value in (headers or {}).items():
        if any(c in name or c in value for c in "\r\n"):
            raise ConfigError(f"the header {name!r} has a line break; send names and values without one")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


class LeanHttpClient:
    """Requests over kept-alive HTTP/1.1 connections (or one each), read as they arrive.

    Args:
        new_connection: a new connection for every request, closed after its answer (the
            request says ``Connection: close``).
        headers: sent with every request (an ``Authorization`` header, say).
        ssl: the TLS context for ``https://`` (default: the system's trusted certificates).
        socket_factory: makes the socket each new connection starts from (default: the
            event loop's own, on this host's network).

    Example::

        async with LeanHttpClient() as client:
            answer = await client.request("GET", "http://127.0.0.1:8000/v1/models")
            print(answer.status, await answer.read())
    """

    def __init__(
        self,
        *,
        new_connection: bool = False,
        headers: Mapping[str, str] | None = None,
        ssl: _ssl.SSLContext | None = None,
        socket_factory: SocketFactory | None = None,
    ) -> None:
        self.new_connection = new_connection
        self._socket_factory = socket_factory
        self._headers = _header_lines(headers)
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._ssl = ssl
        self._heads: dict[tuple[str, str, str], bytes] = {}

    async def __aenter__(self) -> LeanHttpClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection."""
        for connection in list(self._open):
            if connection.transport is not None:
                connection.transport.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close

    async def request(
        self, method: str, url: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> HttpAnswer:
        """Send a request; its answer once the head is in (the body is read from it).

        Raises `ServerAnswerError` (a `ConnectionError`) when the connection fails or closes early,
        and `ConfigError` for a URL that is not ``http://`` or ``https://``. It waits as long
        as the server takes: bound it (``asyncio.wait_for``, or a timer as `send_request` sets).
        """
        key, path = self._target(url)
        request = self._request_bytes(method, key, path, body, headers)
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            connection = await self._connection(key, loop)
            answer = HttpAnswer(loop, connection)
            try:
                return await connection.start(request, answer)
            except ServerAnswerError:
                if not connection.reused or connection._got_bytes or attempt:
                    raise
            except BaseException:
                connection.abort("the request was cancelled")
                raise
        raise AssertionError("unreachable")

    def _target(self, url: str) -> tuple[tuple[str, int, bool], str]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"url must be http://host[:port]/path or https://…, got {url!r}")
        tls = parts.scheme == "https"
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return (parts.hostname, parts.port or (443 if tls else 80), tls), path

    def _request_bytes(
        self,
        method: str,
        key: tuple[str, int, bool],
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None,
    ) -> bytes:
        head_key = (method, key[0] + ":" + str(key[1]), path)
        head = self._heads.get(head_key) if not headers else None
        if head is None:
            extra = _header_lines(headers)
            close = "Connection: close\r\n" if self.new_connection else ""
            host = key[0] if ":" not in key[0] else f"[{key[0]}]"
            default_port = 443 if key[2] else 80
            host_header = host if key[1] == default_port else f"{host}:{key[1]}"
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: dynamo_nb-bench\r\n"
                f"{self._headers}{extra}{close}Content-Length: "
            ).encode("latin-1")
            if not headers:
                self._heads[head_key] = head
        return b"%s%d\r\n\r\n%s" % (head, len(body), body)

    async def _connection(self, key: tuple[str, int, bool], loop: asyncio.AbstractEventLoop) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if (
                not connection.closed
                and connection.transport is not None
                and not connection.transport.is_closing()
            ):
                connection.reused = True
                return connection
        tls: _ssl.SSLContext | None = None
        if key[2]:
            if self._ssl is None:
                self._ssl = _ssl.create_default_context()
            tls = self._ssl
        try:
            if self._socket_factory is None:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, key), key[0], key[1], ssl=tls
                )
            else:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, key),
                    sock=await self._connected_socket(key, loop),
                    ssl=tls,
                    server_hostname=key[0] if tls else None,
                )
        except OSError as exc:
            raise ServerAnswerError(f"could not connect to {key[0]}:{key[1]}: {exc}") from exc
        self._open.add(connection)
        return connection

    async def _connected_socket(
        self, key: tuple[str, int, bool], loop: asyncio.AbstractEventLoop
    ) -> socket.socket:
        assert self._socket_factory is not None
        made = self._socket_factory()
        made.setblocking(False)
        try:
            await loop.sock_connect(made, (key[0], key[1]))
        except BaseException:
            made.close()
            raise
        return made

    def _release(self, connection: _Connection) -> None:
        self._idle.setdefault(connection.key, []).append(connection)

    def _forget(self, connection: _Connection) -> None:
        self._open.discard(connection)
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)


async def fetch(
    url: str,
    *,
    method: str = "GET",
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    socket_factory: SocketFactory | None = None,
) -> tuple[int, bytes]:
    """One request on a connection of its own, read whole: ``(status, body)``, within ``timeout``
    seconds (else `TimeoutError`). A connection that fails or closes early raises
    `ServerAnswerError` (a `ConnectionError`); ``socket_factory`` as `LeanHttpClient`'s.

    Example::

        status, text = await fetch("http://127.0.0.1:8000/metrics", timeout=5)
    """
    async with LeanHttpClient(new_connection=True, socket_factory=socket_factory) as client:

        async def whole() -> tuple[int, bytes]:
            answer = await client.request(method, url, body, headers)
            return answer.status, await answer.read()

        return await asyncio.wait_for(whole(), timeout)
