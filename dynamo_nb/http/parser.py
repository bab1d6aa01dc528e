"""HTTP/1.1 requests read from bytes: the head (request line and headers) and a chunked body.

Strict where a lenient reading would let two parties disagree about where a request ends
(request smuggling): a ``Content-Length`` that is not digits or that differs when repeated,
``Content-Length`` together with ``Transfer-Encoding``, a transfer coding other than
``chunked``, a header line without a colon or with whitespace before it, control characters in
a value. Each problem is an `HttpError` with the status to answer (400, 413, 417, 431, 501,
505) and a message that says what to change; the connection is closed after it.

Example:
    >>> head = parse_head(b"POST /v1/completions?x=1 HTTP/1.1\\r\\nHost: a\\r\\nContent-Length: 2")
    >>> head.method, head.path, head.query, head.content_length, head.keep_alive
    ('POST', '/v1/completions', 'x=1', 2, True)
    >>> decoder = ChunkedDecoder(limit=100)
    >>> buffer = bytearray(b"3\\r\\nabc\\r\\n0\\r\\n\\r\\n")
    >>> decoder.feed(buffer), bytes(decoder.body)
    (True, b'abc')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidRequestError

__all__ = [
    "MAX_HEAD_BYTES",
    "ChunkedDecoder",
    "HttpError",
    "RequestHead",
    "keeps_alive",
    "parse_head",
    "read_content_length",
    "read_header_lines",
]

MAX_HEAD_BYTES = 64 * 1024
"""The request line and headers together, at most (a longer head is a 431)."""
MAX_HEADERS = 100
_MAX_CHUNK_LINE = 4096

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([^\x00-\x20\x7f]+) HTTP/(\d\.\d)")
_HEADER_NAME = re.compile(_TOKEN)
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(;[^\x00-\x08\x0a-\x1f\x7f]*)?")
_MAX_TRAILER_BYTES = 8192


class HttpError(InvalidRequestError):
    """A request that is not HTTP/1.1 the server can take: answered with ``status`` (in OpenAI's
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


def parse_head(raw: bytes) -> RequestHead:
    """The head of a request: ``raw`` is everything before its ``\\r\\n\\r\\n``."""
    lines = raw.split(b"\r\n")
    if len(lines) > MAX_HEADERS + 1:
        raise HttpError(431, f"the request has more than {MAX_HEADERS} headers: send fewer")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise HttpError(
            400, f"malformed request line {lines[0][:80]!r}: send 'METHOD /path HTTP/1.1' and CRLF line ends"
        )
    method, target, version = match.groups()
    if version not in (b"1.1", b"1.0"):
        raise HttpError(505, f"HTTP/{version.decode()} is not supported: use HTTP/1.1")
    headers, lengths = read_header_lines(lines[1:])
    keep_alive = keeps_alive(version == b"1.1", headers)
    content_length = read_content_length(lengths)
    chunked = False
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if content_length is not None:
            raise HttpError(400, "a request cannot have both Content-Length and Transfer-Encoding: send one")
        if coding.strip().lower() != "chunked" or version == b"1.0":
            raise HttpError(
                501, f"Transfer-Encoding {coding!r} is not supported: send Content-Length or chunked"
            )
        chunked = True
    expect = headers.get("expect") if version == b"1.1" else None  # HTTP/1.0 has no expectations
    if expect is not None and expect.strip().lower() != "100-continue":
        raise HttpError(417, f"Expect: {expect!r} cannot be met: only 100-continue is")
    path, _, query = _origin_form(target).partition("?")
    return RequestHead(
        method.decode("ascii"),
        path,
        query,
        version.decode("ascii"),
        headers,
        keep_alive,
        content_length,
        chunked,
        expect is not None,
    )


def read_header_lines(lines: list[bytes]) -> tuple[dict[str, str], set[bytes]]:
    """Header lines (of a request or an answer), strictly: lower-case names to values (a repeated
    header's joined with ", "), and the ``Content-Length`` values as sent."""
    headers: dict[str, str] = {}
    lengths: set[bytes] = set()
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or _HEADER_NAME.fullmatch(name) is None:
            raise HttpError(400, f"malformed header line {line[:80]!r}: send 'Name: value'")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            raise HttpError(400, f"the {name.decode()} header has a control character in its value")
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        if key == "content-length":
            lengths.add(value)
        if key in headers:
            headers[key] += ", " + text
        else:
            headers[key] = text
    return headers, lengths


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


def read_content_length(values: set[bytes]) -> int | None:
    """The body's length from the ``Content-Length`` values of `read_header_lines` (None: none
    sent); repeated, they must agree."""
    if not values:
        return None
    parts = [part.strip() for part in next(iter(values)).split(b",")]  # repeated: "5, 5"
    if len(values) > 1 or not all(part.isdigit() for part in parts):
        raise HttpError(400, "the Content-Length header must be one number of bytes")
    if any(len(part) > 18 for part in parts):
        raise HttpError(413, "the body is larger than this server takes")
    lengths = {int(part) for part in parts}
    if len(lengths) > 1:
        raise HttpError(400, "the Content-Length header must be one number of bytes")
    return lengths.pop()


def _origin_form(target: bytes) -> str:
    """The path and query of a request target (``/path?q``, or a proxy's ``http://host/path?q``)."""
    text = target.decode("latin-1")
    if text.startswith("/"):
        return text
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        slash = rest.find("/")
        return rest[slash:] if slash >= 0 else "/"
    raise HttpError(400, f"the request target {text[:80]!r} must be a path starting with '/'")


class ChunkedDecoder:
    """The body of a ``Transfer-Encoding: chunked`` request, read as its bytes arrive.

    `feed` takes what it can from the front of a buffer (deleting it there) and returns True
    once the last chunk and the trailers are in; `body` holds the bytes. A body beyond
    ``limit`` bytes is an `HttpError` (413).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.body = bytearray()
        self._left = -1  # bytes left in the current chunk; -1: a size line comes next
        self._trailers = False
        self._trailer_bytes = 0
        self.done = False

    def feed(self, buffer: bytearray) -> bool:
        if self.done:  # what follows is the next request's
            return True
        while True:
            if self._trailers:  # header lines until an empty one
                end = buffer.find(b"\r\n")
                if end < 0:
                    self._check_line(buffer)
                    return False
                if end == 0:
                    del buffer[:2]
                    self.done = True
                    return True
                self._trailer(bytes(buffer[:end]))
                del buffer[: end + 2]
            elif self._left < 0:
                end = buffer.find(b"\r\n")
                if end < 0:
                    self._check_line(buffer)
                    return False
                match = _CHUNK_SIZE.fullmatch(bytes(buffer[:end]))
                if match is None:
                    raise HttpError(400, f"malformed chunk size line {bytes(buffer[:end][:40])!r}")
                del buffer[: end + 2]
                size = int(match.group(1), 16)
                if len(self.body) + size > self.limit:
                    raise HttpError(413, f"the request body is larger than {self.limit} bytes")
                if size == 0:
                    self._trailers = True
                else:
                    self._left = size
            else:
                if len(buffer) < self._left + 2:
                    if len(buffer) > self._left:  # keep the chunk's end to check it
                        return False
                    self.body += buffer
                    self._left -= len(buffer)
                    buffer.clear()
                    return False
                if buffer[self._left : self._left + 2] != b"\r\n":
                    raise HttpError(400, "a chunk is longer than its size line says")
                self.body += buffer[: self._left]
                del buffer[: self._left + 2]
                self._left = -1

    def _trailer(self, line: bytes) -> None:
        """A trailer line, held to a header's rules (and all of them to 8 KiB)."""
        self._trailer_bytes += len(line) + 2
        if self._trailer_bytes > _MAX_TRAILER_BYTES:
            raise HttpError(431, f"the request's trailers are larger than {_MAX_TRAILER_BYTES} bytes")
        name, colon, value = line.partition(b":")
        if not colon or _HEADER_NAME.fullmatch(name) is None or _BAD_VALUE.search(value) is not None:
            raise HttpError(400, f"malformed trailer line {line[:80]!r}: send 'Name: value'")

    @staticmethod
    def _check_line(buffer: bytearray) -> None:
        if len(buffer) > _MAX_CHUNK_LINE:
            raise HttpError(400, f"a chunk size or trailer line is longer than {_MAX_CHUNK_LINE} bytes")
