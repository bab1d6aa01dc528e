"""Decode bytes that came from the network with memory bounded by their size.

msgpack and JSON turn a byte or two into a whole Python object: an empty map is one byte of
msgpack and a 64-byte dict, so a 4 MB frame of empty maps would take about 270 MB to decode.
Scalars cost at most ~40× their encoded size (a small negative integer: one byte, a 28-byte int
and its pointer), but arrays and maps have no such bound. So:

- `unpack_bounded` / `unpack_all_bounded` decode msgpack; when the data is larger than
  `SMALL_BYTES` every array and map is counted as it is built, and decoding stops with
  `dynamo_nb.errors.FrameTooLargeError` once they would take more than `CONTAINER_BYTES_PER_BYTE`
  times the data's size (plus `SMALL_BYTES`): a list costs its pointers, so a list of one-byte
  integers (8×) passes and a frame of empty maps (72×) does not. Nesting deeper than msgpack's
  stack is refused too.
- `json_nesting_problem` says, before `json.loads`, whether a JSON body holds more arrays and
  objects than the same budget allows (counted outside strings when the brackets are many).

Frames smaller than `SMALL_BYTES` decode at full speed: at worst they cost a few MB.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import msgpack
from msgpack import unpackb

from ..errors import FrameTooLargeError

__all__ = [
    "CONTAINER_BYTES_PER_BYTE",
    "SMALL_BYTES",
    "json_nesting_problem",
    "unpack_all_bounded",
    "unpack_bounded",
]

SMALL_BYTES = 64 * 1024
CONTAINER_BYTES_PER_BYTE = 12  # a list of one-byte integers costs 8: its pointers
_JSON_CONTAINER_BYTES = 64  # an empty list is 56 bytes, an empty dict 64, plus the parent's pointer
# A string, or an unclosed one to the end: every match that starts at a quote succeeds, so the
# scan is linear (a pattern that could fail there would rescan the rest from each quote).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


class _ContainerBudget:
    """msgpack's list/object hook: counts what the arrays and maps decoded so far take."""

    __slots__ = ("left", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.left = CONTAINER_BYTES_PER_BYTE * size + SMALL_BYTES

    def __call__(self, value: Any) -> Any:
        # a list's pointers (not the spare room msgpack's appends left), a dict as it is
        self.left -= (64 + 8 * len(value)) if isinstance(value, list) else sys.getsizeof(value) + 8
        if self.left < 0:
            raise FrameTooLargeError(
                f"a message of {self.size} bytes holds arrays and maps that would take more than "
                f"{CONTAINER_BYTES_PER_BYTE * self.size + SMALL_BYTES} bytes to decode; it was refused"
            )
        return value


def _hooks(size: int) -> dict[str, Any]:
    """msgpack's hooks that count a message of ``size`` bytes (none for a small one)."""
    if size <= SMALL_BYTES:
        return {}
    budget = _ContainerBudget(size)
    return {"list_hook": budget, "object_hook": budget}


def unpack_bounded(data: bytes | bytearray | memoryview, *, strict_map_key: bool = True) -> Any:
    """Decode one msgpack value; a large one whose arrays and maps would take more than
    `CONTAINER_BYTES_PER_BYTE` × its size raises `FrameTooLargeError` (``strict_map_key=False``
    allows map keys other than str and bytes).

    Example:
        >>> unpack_bounded(msgpack.packb([1, {"a": "b"}]))
        [1, {'a': 'b'}]
        >>> unpack_bounded(msgpack.packb([{}] * 200_000))
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.FrameTooLargeError: a message of 200005 bytes holds arrays and maps that would take more than 2465596 bytes to decode; it was refused
    """
    size = len(data)
    try:
        if size <= SMALL_BYTES:  # the common case (a token's frame): msgpack at full speed
            return unpackb(data, raw=False, strict_map_key=strict_map_key)
        return unpackb(data, raw=False, strict_map_key=strict_map_key, **_hooks(size))
    except msgpack.StackError:
        raise FrameTooLargeError("a message nests arrays or maps too deeply; it was refused") from None


def unpack_all_bounded(data: bytes) -> list[Any]:
    """Decode every msgpack value in ``data`` (NATS carries several frames in one message), with
    one budget for all of them.

    Example:
        >>> unpack_all_bounded(msgpack.packb([11, 7]) + msgpack.packb([10, 7, "x"]))
        [[11, 7], [10, 7, 'x']]
    """
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1), **_hooks(len(data)))
    unpacker.feed(data)
    try:
        return list(unpacker)
    except msgpack.StackError:
        raise FrameTooLargeError("a message nests arrays or maps too deeply; it was refused") from None


def json_nesting_problem(raw: bytes) -> str | None:
    """Why ``raw`` (a JSON document) must not be decoded, or None: a large body with more arrays
    and objects than `CONTAINER_BYTES_PER_BYTE` × its size allows.

    Example:
        >>> json_nesting_problem(b'{"prompt": "hi"}') is None
        True
        >>> json_nesting_problem(b"[" + b"[]," * 100_000 + b"[]]")
        'the body holds 100002 arrays and objects in 300004 bytes: too many to decode (at most 57274); send fewer'
    """
    size = len(raw)
    if size <= SMALL_BYTES:
        return None
    containers = raw.count(b"[") + raw.count(b"{")
    if containers * _JSON_CONTAINER_BYTES > CONTAINER_BYTES_PER_BYTE * size:  # brackets in strings?
        structure = _JSON_STRING.sub(b"", raw)
        containers = structure.count(b"[") + structure.count(b"{")
    allowed = (CONTAINER_BYTES_PER_BYTE * size + SMALL_BYTES) // _JSON_CONTAINER_BYTES
    if containers <= allowed:
        return None
    return (
        f"the body holds {containers} arrays and objects in {size} bytes: too many to decode "
        f"(at most {allowed}); send fewer"
    )
