"""Wire format shared by the request planes: msgpack frames, never pickle.

A frame is a msgpack array whose first element is its kind:

    client → server   [REQUEST, sid, target, request_id, body, metadata?]
                                                                   start a stream (metadata: the
                                                                   context's, only when it has some)
                      [STOP, sid]                                  stop it (cancellation)
                      [PING, sid, target]                          is ``target`` served here?
    server → client   [ITEM, sid, data]                            one stream item
                      [END, sid]                                   the stream finished normally
                      [ERROR, sid, code, error_type, message, details?]
                                                                   it failed (code: see ErrorCode; details:
                                                                   the HTTP answer of one of our errors)
                      [HEARTBEAT, sid]                             still alive (sid 0: whole connection)
                      [ACK, sid, control]                          NATS: where to send STOP
                      [PONG, sid]                                  answer to PING

On TCP each frame travels with a 4-byte big-endian length prefix; on NATS one message carries
a msgpack array of frames.

Sizes are bounded per direction: what a server reads (REQUEST, STOP, PING) is at most
`MAX_REQUEST_FRAME_BYTES`, what a client reads (the stream's items) at most `MAX_FRAME_BYTES`,
both checked from the length prefix before the frame is buffered; decoding is bounded too
(`dynamo_nb.runtime.bounded_decode`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack
from msgpack import unpackb

from ...errors import FrameTooLargeError
from ..bounded_decode import SMALL_BYTES, TINY_BYTES, unpack_bounded

__all__ = [
    "ACK",
    "END",
    "ERROR",
    "HEARTBEAT",
    "ITEM",
    "MAX_FRAME_BYTES",
    "MAX_REQUEST_FRAME_BYTES",
    "PING",
    "PONG",
    "REQUEST",
    "STOP",
    "ErrorCode",
    "FrameDecoder",
    "decode",
    "encode",
    "encode_prefixed",
    "error_frame",
    "request_fields",
    "request_tail",
]

REQUEST, STOP, PING = 0, 1, 2
ITEM, END, ERROR, HEARTBEAT, ACK, PONG = 10, 11, 12, 13, 14, 15

MAX_FRAME_BYTES = 32 * 1024 * 1024
MAX_REQUEST_FRAME_BYTES = 4 * 1024 * 1024  # a request: token ids of a 500k-token prompt fit
_PREFIX = struct.Struct(">I")


class ErrorCode:
    """Values of the ``code`` field of an ERROR frame."""

    HANDLER = "handler"  # the handler raised
    NO_INSTANCE = "no_instance"  # the target is not served (any more) by this process
    ENCODE = "encode"  # an item could not be encoded (not JSON-able)
    SHUTDOWN = "shutdown"  # the server stopped before the handler finished


def error_frame(
    sid: int, code: str, error_type: str, message: str, details: dict[str, Any] | None = None
) -> tuple[Any, ...]:
    """An ERROR frame; ``details`` (`dynamo_nb.errors.error_details`) only when there are some.

    Example:
        >>> error_frame(7, ErrorCode.HANDLER, "KeyError", "'x'")
        (12, 7, 'handler', 'KeyError', "'x'")
    """
    if details is None:
        return (ERROR, sid, code, error_type, message)
    return (ERROR, sid, code, error_type, message, details)


def request_tail(target: str, request_id: str, body: Any, metadata: dict[str, Any] | None) -> tuple[Any, ...]:
    """A REQUEST frame's fields after its stream id; the context's metadata only when it has some.

    Example:
        >>> request_tail("ns.comp.ep/1", "r1", {"x": 1}, None)
        ('ns.comp.ep/1', 'r1', {'x': 1})
    """
    return (target, request_id, body, metadata) if metadata else (target, request_id, body)


def request_fields(frame: Sequence[Any]) -> tuple[Any, Any, Any, dict[str, Any] | None] | None:
    """``(target, request_id, body, metadata)`` of a REQUEST frame, None when it has neither 5 nor
    6 fields (metadata that is not a dict is dropped).

    Example:
        >>> request_fields([REQUEST, 3, "t", "r1", {}, {"user": "a"}])
        ('t', 'r1', {}, {'user': 'a'})
    """
    if len(frame) not in (5, 6):
        return None
    metadata = frame[5] if len(frame) == 6 and isinstance(frame[5], dict) else None
    return frame[2], frame[3], frame[4], metadata


def encode(frame: Any) -> bytes:
    """msgpack-encode ``frame``; raises TypeError for values msgpack cannot carry."""
    return _pack(frame)


# One packer for every frame (packb builds one per call, ~0.5 µs of a token's frame); pack()
# holds the GIL throughout and empties its buffer after each frame, even a failed one.
_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def decode(data: bytes | memoryview, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    """Decode one msgpack value (never executes code, unlike pickle) of at most ``max_bytes``,
    with bounded memory (`dynamo_nb.runtime.bounded_decode.unpack_bounded`)."""
    if len(data) > max_bytes:
        raise FrameTooLargeError(f"peer sent a frame of {len(data)} bytes (limit {max_bytes})")
    return unpack_bounded(data)


def encode_prefixed(frame: Any) -> bytes:
    """Encode ``frame`` with its 4-byte length prefix (TCP)."""
    body = _pack(frame)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return _PREFIX.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder of length-prefixed frames of at most ``max_bytes`` each: a longer
    one raises `FrameTooLargeError` as soon as its prefix arrives, before it is buffered.

    Example:
        >>> d = FrameDecoder()
        >>> d.feed(encode_prefixed([11, 7]) + encode_prefixed([10, 7, {"x": 1}]))
        [[11, 7], [10, 7, {'x': 1}]]
    """

    __slots__ = ("_buffer", "max_bytes")

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self.max_bytes = max_bytes

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return every complete frame they finish."""
        buffer = self._buffer
        buffer += data
        frames: list[Any] = []
        append = frames.append
        unpack_from = _PREFIX.unpack_from
        offset = 0
        size = len(buffer)
        while size - offset >= 4:
            (length,) = unpack_from(buffer, offset)
            if length > self.max_bytes:
                raise FrameTooLargeError(f"peer sent a frame of {length} bytes (limit {self.max_bytes})")
            end = offset + 4 + length
            if end > size:
                break
            if length <= TINY_BYTES:  # a token's frame: within the decode budget whatever it holds
                append(unpackb(buffer[offset + 4 : end], raw=False))
            elif length <= SMALL_BYTES:  # copying its bytes beats a memoryview
                append(unpack_bounded(buffer[offset + 4 : end]))
            else:
                with memoryview(buffer) as view, view[offset + 4 : end] as body:
                    append(unpack_bounded(body))
            offset = end
        if offset:
            del buffer[:offset]
        return frames
