"""HTTP/1.1 requests read from a connection's bytes as they arrive, by llhttp (Node.js's parser,
through `httptools`), with the server's own rules on top.

llhttp reads the framing strictly: a request line, ``Name: value`` header lines with CRLF ends,
no control characters, no folding, one ``Content-Length`` of digits, never with
``Transfer-Encoding``, a chunked body's size lines and trailers. On top of it, so that no two
parties can disagree about where a request ends (request smuggling) and no client can make the
server hold or scan unbounded bytes:

- an HTTP/1.1 request names exactly one ``Host`` (RFC 9112 §3.2);
- the head is at most `MAX_HEAD_BYTES` and `MAX_HEADERS` headers however it is dripped (each byte
  is read once: llhttp keeps no buffer to scan again), a body at most the server's limit;
- a transfer coding other than ``chunked`` is a 501, HTTP other than 1.0 and 1.1 a 505, an
  ``Expect`` other than ``100-continue`` a 417;
- a chunk size line (its extensions included) is at most `MAX_CHUNK_LINE` bytes, the trailers at
  most 8 KiB together.

Each problem is an `HttpError` with the status to answer (400, 413, 417, 431, 501, 505) and a
message that says what to change; the connection is closed after it.

Example:
    >>> head = parse_head(b"POST /v1/completions?x=1 HTTP/1.1\\r\\nHost: a\\r\\nContent-Length: 2")
    >>> head.method, head.path, head.query, head.content_length, head.keep_alive
    ('POST', '/v1/completions', 'x=1', 2, True)
    >>> parser = RequestParser(max_body=100)
    >>> parser.feed(b"POST / HTTP/1.1\\r\\nHost: a\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n3\\r\\nabc\\r\\n")
    >>> parser.feed(b"0\\r\\n\\r\\n")
    >>> [(head.path, body) for head, body in parser.ready]
    [('/', b'abc')]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httptools

from ..errors import InvalidRequestError

__all__ = [
    "MAX_CHUNK_LINE",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "HttpError",
    "RequestHead",
    "RequestParser",
    "keeps_alive",
    "parse_head",
]

MAX_HEAD_BYTES = 64 * 1024
"""The request line and headers together, at most (a longer head is a 431)."""
MAX_HEADERS = 100
MAX_CHUNK_LINE = 4096
"""A chunk size line with its extensions, at most (a longer one is a 400)."""
MAX_TRAILER_BYTES = 8192
_SLICE = 1024  # a chunked body is fed in slices this long, so a long size line is seen however it arrives


class HttpError(InvalidRequestError):
    """A request that is not HTTP/1.1 the server can take: answered with ``status`` (in the app's
    error envelope) and the connection closed.

    Example:
        >>> HttpError(431, "the request's headers are too large").http_status
        431
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.http_status = status  # type: ignore[misc]  # this request's answer
        self.allow: list[str] = []  # a 405's methods (its Allow header)


@dataclass(slots=True)
class RequestHead:
    """A request's line and headers, read.

    Attributes:
        method: as sent (methods are case-sensitive: ``POST``).
        path: the target's path, ``/v1/models``; query: what follows its ``?`` (or "").
        version: ``"1.1"`` or ``"1.0"``.
        headers: lower-case names; a repeated header's values joined with ", ".
        keep_alive: whether the connection stays open after the answer.
        content_length: the body's length (None: no ``Content-Length``).
        chunked: the body comes in chunks (``Transfer-Encoding: chunked``).
        expect_continue: the client waits for ``100 Continue`` before it sends the body.
    """

    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    keep_alive: bool
    content_length: int | None
    chunked: bool
    expect_continue: bool


def keeps_alive(http11: bool, headers: dict[str, str]) -> bool:
    """Whether the connection stays open after this message: HTTP/1.1's default, or its
    ``Connection`` header's ``close`` / ``keep-alive``."""
    connection = headers.get("connection")
    if connection is not None:
        options = {option.strip().lower() for option in connection.split(",")}
        if "close" in options:
            return False
        if "keep-alive" in options:
            return True
    return http11


def _origin_form(target: bytes) -> tuple[str, str]:
    """The path and query of a request target (``/path?q``, or a proxy's ``http://host/path?q``)."""
    text = target.decode("latin-1")
    if not text.startswith("/"):
        scheme, sep, rest = text.partition("://")
        if not (sep and scheme.lower() in ("http", "https")):
            raise HttpError(400, f"the request target {text[:80]!r} must be a path starting with '/'")
        slash = rest.find("/")
        text = rest[slash:] if slash >= 0 else "/"
    path, _, query = text.partition("?")
    return path, query


# llhttp's reasons → what the client should change (status, message); the rest are a 400 as read
_LLHTTP_REASONS = (
    (
        "can't be present with",
        400,
        "a request cannot have both Content-Length and Transfer-Encoding: send one",
    ),
    ("Content-Length overflow", 413, "the body is larger than this server takes"),
    ("Duplicate Content-Length", 400, "the Content-Length header must be one number of bytes, sent once"),
    ("Content-Length", 400, "the Content-Length header must be one number of bytes"),
    ("Transfer-Encoding", 501, "this Transfer-Encoding is not supported: send Content-Length or chunked"),
    ("url", 400, "the request target must be a path starting with '/', in characters a URL allows"),
    ("method", 400, "malformed request line: send 'METHOD /path HTTP/1.1' with a method HTTP defines"),
    ("version", 400, "malformed request line: send 'METHOD /path HTTP/1.1' and CRLF line ends"),
    (
        "header",
        400,
        "malformed header line: send 'Name: value' lines with CRLF ends and no control characters",
    ),
    ("chunk", 400, "malformed chunk size line: send the size in hex, then CRLF"),
)


def _refusal(exc: httptools.HttpParserError) -> HttpError:
    reason = str(exc) or type(exc).__name__
    for fragment, status, message in _LLHTTP_REASONS:
        if fragment.lower() in reason.lower():
            return HttpError(status, f"{message} ({reason})")
    return HttpError(400, f"the request could not be read: {reason}"[:200])


class RequestParser:
    """The requests of one connection, read as its bytes arrive (`feed`); complete ones (their
    head and whole body) wait in `ready`, in order. ``on_head`` is called with each head as soon
    as it is read (before its body: the server answers ``100 Continue`` and times the body).

    A malformed request raises `HttpError`; the parser is then done (the connection closes).
    """

    def __init__(self, max_body: int, on_head: Callable[[RequestHead], None] | None = None) -> None:
        self.max_body = max_body
        self.on_head = on_head
        self.ready: deque[tuple[RequestHead, bytes]] = deque()
        self.head: RequestHead | None = None  # read, its body not yet whole
        self._parser = httptools.HttpRequestParser(self)
        self._pending = bytearray()  # a head's first bytes, until its blank line arrives
        self._scanned = 0  # of them, searched for the blank line already
        self._target = b""
        self._headers: dict[str, str] = {}
        self._hosts = 0
        self._lines = 0
        self._body: bytes | bytearray = b""
        self._progress = 0  # callbacks so far: a feed that made none read inside one line
        self._line_bytes = 0  # of a chunk size line in progress, at least
        self._trailer_bytes = 0
        self._error: HttpError | None = None

    def feed(self, data: bytes) -> None:
        """Read ``data``: complete requests are appended to `ready`.

        llhttp is handed whole heads (gathered here, each byte scanned once: a head dripped a
        byte at a time costs linear time, and more than `MAX_HEAD_BYTES` is a 431 at once), a
        body up to its end, and a chunked body in slices (so a chunk line too long is seen
        however it arrives). A read of at most a slice that ends a head, or continues a body,
        goes in whole."""
        if self._error is not None:
            raise self._error
        if len(data) <= _SLICE and (self.head is not None or (not self._pending and b"\r\n\r\n" in data)):
            self._feed(data)  # the usual request, whole in one read: one call into llhttp
            return
        while data:
            head = self.head
            if head is None:
                data = self._feed_head(data)
                continue
            cut = _SLICE if head.chunked else (head.content_length or 0) - len(self._body)
            if cut >= len(data):
                self._feed(data)
                return
            self._feed(data[:cut])
            data = data[cut:]

    def _feed_head(self, data: bytes) -> bytes:
        """Gather a head until its blank line; feed it whole; return what follows it."""
        pending = self._pending
        if pending:
            pending += data
            buffer: bytes | bytearray = pending
        else:
            buffer = data
        end = buffer.find(b"\r\n\r\n", max(self._scanned - 3, 0))
        if end < 0 or end > MAX_HEAD_BYTES:
            if len(buffer) > MAX_HEAD_BYTES:
                self._error = HttpError(431, f"the request's head is larger than {MAX_HEAD_BYTES} bytes")
                raise self._error
            if not pending:
                pending += data
            self._scanned = len(buffer)
            return b""
        self._scanned = 0
        cut = end + 4
        if pending:
            self._pending = bytearray()
            self._feed(bytes(buffer[:cut]))
            return bytes(buffer[cut:])
        if cut == len(data):
            self._feed(data)
            return b""
        self._feed(data[:cut])
        return data[cut:]

    def _feed(self, data: bytes) -> None:
        progress = self._progress
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:  # an Upgrade asked for: ignored, as is allowed
            self._restart_after(data, exc)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self._error = cause if isinstance(cause, HttpError) else _refusal(exc)
            raise self._error from None
        if self.head is not None and self.head.chunked:
            if self._progress == progress:  # inside a size line (or a trailer) all along
                self._line_bytes += len(data)
                if self._line_bytes > MAX_CHUNK_LINE:
                    self._error = HttpError(
                        400, f"a chunk size or trailer line is longer than {MAX_CHUNK_LINE} bytes"
                    )
                    raise self._error
            else:
                self._line_bytes = 0

    def _restart_after(self, data: bytes, exc: httptools.HttpParserUpgrade) -> None:
        """Serve an ``Upgrade`` request as a plain one, then read on with a fresh parser."""
        offset = int(exc.args[0]) if exc.args else len(data)
        self._parser = httptools.HttpRequestParser(self)
        if offset < len(data):
            self.feed(data[offset:])

    # -- llhttp's callbacks (httptools calls them by these names)

    def on_message_begin(self) -> None:
        self._target = b""
        self._headers = {}
        self._hosts = 0
        self._lines = 0
        self._body = b""
        self._trailer_bytes = 0
        self._line_bytes = 0

    def on_url(self, piece: bytes) -> None:
        self._target += piece

    def on_header(self, name: bytes, value: bytes) -> None:
        self._progress += 1
        if self.head is not None:  # a trailer, after the last chunk
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > MAX_TRAILER_BYTES:
                raise HttpError(431, f"the request's trailers are larger than {MAX_TRAILER_BYTES} bytes")
            return
        self._lines += 1
        if self._lines > MAX_HEADERS:
            raise HttpError(431, f"the request has more than {MAX_HEADERS} headers: send fewer")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        headers = self._headers
        if key in headers:
            headers[key] += ", " + text
        else:
            headers[key] = text
        if key == "host":
            self._hosts += 1

    def on_headers_complete(self) -> None:
        self._progress += 1
        parser, headers = self._parser, self._headers
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise HttpError(505, f"HTTP/{version} is not supported: use HTTP/1.1")
        if version == "1.1" and self._hosts != 1:
            raise HttpError(
                400,
                "an HTTP/1.1 request names its host in one Host header: send one"
                if self._hosts
                else "an HTTP/1.1 request must have a Host header: send one",
            )
        length_text = headers.get("content-length")
        content_length = int(length_text) if length_text is not None else None
        chunked = False
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked" or version == "1.0":
                raise HttpError(
                    501, f"Transfer-Encoding {coding!r} is not supported: send Content-Length or chunked"
                )
            chunked = True
        expect = headers.get("expect") if version == "1.1" else None  # HTTP/1.0 has no expectations
        if expect is not None and expect.strip().lower() != "100-continue":
            raise HttpError(417, f"Expect: {expect!r} cannot be met: only 100-continue is")
        if content_length is not None and content_length > self.max_body:
            raise HttpError(413, f"the request body is larger than {self.max_body} bytes")
        path, query = _origin_form(self._target)
        head = self.head = RequestHead(
            parser.get_method().decode("ascii"),
            path,
            query,
            version,
            headers,
            keeps_alive(version == "1.1", headers),
            content_length,
            chunked,
            expect is not None,
        )
        if self.on_head is not None:
            self.on_head(head)

    def on_body(self, piece: bytes) -> None:
        self._progress += 1
        body = self._body
        if len(body) + len(piece) > self.max_body:
            raise HttpError(413, f"the request body is larger than {self.max_body} bytes")
        if not body:
            self._body = piece
        else:
            if type(body) is bytes:  # appended to from now on: in place, not copied each time
                body = self._body = bytearray(body)
            body += piece  # a bytearray here

    def on_chunk_header(self) -> None:
        self._progress += 1

    def on_chunk_complete(self) -> None:
        self._progress += 1

    def on_message_complete(self) -> None:
        self._progress += 1
        head = self.head
        assert head is not None  # llhttp completes a message only after its head
        body = self._body
        self.ready.append((head, body if type(body) is bytes else bytes(body)))
        self.head = None
        self._body = b""


def parse_head(raw: bytes) -> RequestHead:
    """The head of a request: ``raw`` is everything before its ``\\r\\n\\r\\n``.

    Example:
        >>> parse_head(b"GET /v1/models HTTP/1.1\\r\\nHost: a").path
        '/v1/models'
    """
    heads: list[RequestHead] = []
    parser = RequestParser(max_body=1 << 62, on_head=heads.append)
    parser.feed(raw + b"\r\n\r\n")
    if not heads:
        raise HttpError(400, "the head is not complete: end it with an empty line")
    return heads[0]
