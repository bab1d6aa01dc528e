"""What a route handler gets and gives back: an `HttpRequest`, and an `HttpResponse` (a whole
body) or a `StreamedResponse` (a body written as it comes, in chunks).

Example::

    async def live(request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live"})

    async def events(request: HttpRequest) -> StreamedResponse:
        response = request.stream({"Content-Type": "text/event-stream"})
        await response.write(b"data: 1\\n\\n")       # the head goes out with the first write
        await response.write_eof(b"data: [DONE]\\n\\n")  # the last bytes and the body's end
        return response
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol

__all__ = ["HttpRequest", "HttpResponse", "StreamedResponse", "json_response"]

JSON_TYPE = "application/json; charset=utf-8"


def _reasons() -> dict[int, bytes]:
    return {status.value: status.phrase.encode() for status in HTTPStatus}


class Connection(Protocol):
    """What a response needs of its connection (`http_server.HttpConnection` is one)."""

    write_paused: bool

    @property
    def peer(self) -> str:
        """The client's address, ``host:port`` (for logs)."""
        ...

    def send(self, data: bytes) -> None: ...

    async def drained(self) -> None: ...

    def connection_header(self, request: HttpRequest) -> bytes: ...


_REASONS = _reasons()
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a value's tab is allowed, no other control
_CHECKED_NAMES: set[str] = set()
_date: tuple[int, bytes] = (0, b"")


def http_date() -> bytes:
    """The ``Date`` header's value now (made once a second)."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True).encode())
    return _date[1]


def response_head(status: int, headers: Mapping[str, str], framing: bytes, connection: bytes) -> bytes:
    """A response's status line and headers, ``framing`` (a ``Content-Length`` or
    ``Transfer-Encoding`` line, or nothing) and ``connection`` (its ``Connection`` line, or
    nothing) included, through the blank line. A header name that is not a token, or a value
    with a line break or control character, is refused (`ValueError`): it could start a header
    of its own, or end the head early.

    Example:
        >>> response_head(200, {"Bad Name": "x"}, b"", b"")
        Traceback (most recent call last):
        ...
        ValueError: the response header name 'Bad Name' is not an HTTP token (letters, digits, -)
    """
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    for name, value in headers.items():
        if name not in _CHECKED_NAMES:
            if _TOKEN.fullmatch(name) is None:
                raise ValueError(
                    f"the response header name {name!r} is not an HTTP token (letters, digits, -)"
                )
            if len(_CHECKED_NAMES) < 1024:  # names are few and fixed: check each once
                _CHECKED_NAMES.add(name)
        value = str(value)
        if _BAD_VALUE.search(value) is not None:
            raise ValueError(
                f"the response header {name!r} has a line break or control character in its value"
            )
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    lines.append(b"Date: " + http_date() + b"\r\n" + framing + connection + b"\r\n")
    return b"".join(lines)


class HttpRequest:
    """One request: its method, path, query, headers (lower-case names) and whole body.

    Attributes:
        method: ``GET``, ``POST``…
        path: ``/v1/chat/completions``; query: what followed ``?`` in the target (or "").
        headers: lower-case names, e.g. ``request.headers.get("x-request-id")``.
        body: the body's bytes (read whole before the handler runs).
        keep_alive: whether the connection stays open after the answer.
    """

    __slots__ = ("_connection", "body", "headers", "keep_alive", "method", "path", "query", "version")

    def __init__(
        self,
        connection: Connection,
        method: str,
        path: str,
        query: str,
        version: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self._connection = connection
        self.method, self.path, self.query, self.version = method, path, query, version
        self.headers, self.body, self.keep_alive = headers, body, keep_alive

    @property
    def peer(self) -> str:
        """The client's address, ``host:port`` (for logs)."""
        return self._connection.peer

    def stream(self, headers: Mapping[str, str] | None = None, status: int = 200) -> StreamedResponse:
        """A response whose body is written as it comes (chunked); its head goes out with the
        first write."""
        return StreamedResponse(self, status, headers or {})

    def __repr__(self) -> str:
        return f"<HttpRequest {self.method} {self.path}>"


class HttpResponse:
    """A response with its whole body.

    Example:
        >>> HttpResponse(b"ok", headers={"Content-Type": "text/plain"}).status
        200
    """

    __slots__ = ("body", "headers", "status")

    def __init__(
        self, body: bytes = b"", *, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        self.body, self.status, self.headers = body, status, headers or {}

    def encode(self, connection: bytes = b"", head_only: bool = False) -> bytes:
        """The response's bytes: head (with its ``connection`` line) and body (only the head
        for a ``HEAD`` request)."""
        length = b"Content-Length: %d\r\n" % len(self.body)
        head = response_head(self.status, self.headers, length, connection)
        return head if head_only else head + self.body


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> HttpResponse:
    """``body`` as a JSON response.

    Example:
        >>> json_response({"status": "live"}).body
        b'{"status": "live"}'
    """
    return HttpResponse(
        json.dumps(body).encode(), status=status, headers={"Content-Type": JSON_TYPE, **(headers or {})}
    )


class StreamedResponse:
    """A response written as it comes: chunks of an HTTP/1.1 chunked body (for an HTTP/1.0
    client, the bytes as they are, the connection's close ending the body).

    `write` waits while the client reads slower than the server writes (at most the server's
    idle timeout, then the connection is closed); a write after the client left raises
    `ConnectionResetError`.
    """

    __slots__ = ("_chunked", "_connection", "_head", "_head_only", "_request", "ended", "headers", "status")

    def __init__(self, request: HttpRequest, status: int, headers: Mapping[str, str]) -> None:
        self._request, self._connection = request, request._connection
        self.status, self.headers = status, headers
        self._chunked = request.version == "1.1"
        self._head_only = request.method == "HEAD"  # the head alone, no body
        if not self._chunked:
            request.keep_alive = False  # an HTTP/1.0 client reads the body to the connection's close
        self._head: bytes | None = None  # sent with the first write
        self.ended = False

    def _framed(self, data: bytes) -> bytes:
        if self._head_only:
            data = b""
        body = b"%x\r\n%s\r\n" % (len(data), data) if self._chunked and data else data
        if self._head is None:
            framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
            connection = self._connection.connection_header(self._request)
            self._head = response_head(self.status, self.headers, framing, connection)
            return self._head + body
        return body

    async def write(self, data: bytes) -> None:
        """Send ``data`` (the head first, if it has not gone yet)."""
        if self.ended:
            raise RuntimeError("write after write_eof")
        connection = self._connection
        connection.send(self._framed(data))
        if connection.write_paused:
            await connection.drained()

    async def write_eof(self, data: bytes = b"") -> None:
        """Send ``data`` and end the body (one write)."""
        if self.ended:
            return
        self.ended = True
        framed = self._framed(data)
        self._connection.send(framed + b"0\r\n\r\n" if self._chunked and not self._head_only else framed)
        if self._connection.write_paused:
            await self._connection.drained()
