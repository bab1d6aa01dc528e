"""Decode bytes that came from the network with memory bounded by their size.

msgpack and JSON turn a byte or two into a whole Python object: an empty map is one byte of
msgpack and a 64-byte dict, a one-byte negative integer a 28-byte int, so a 4 MB frame of them
would take 150–270 MB to decode. So before a message is decoded, what its objects will take is
added up from the bytes, without building any of them, and the message is refused
(`dynamo_nb.errors.FrameTooLargeError`) when that is more than its `decode_budget`:
`DECODE_BYTES_PER_BYTE` (5) times its size, or `DECODE_ALLOWANCE_BYTES` (8 MiB) for a message
small enough that five times its size is less (so a prompt of up to ~200 K token ids passes:
a 600 KB list that takes 7 MB as Python ints).

- `msgpack_cost` walks msgpack's items in order (a container is its header; its items follow
  it), charging each the bytes its object takes: a list its pointers, a dict its table, an int,
  a float or a string its object (a string with a character beyond ASCII up to 5 bytes per
  byte). Runs of items of one kind (token ids, empty maps) are skipped with one regular
  expression each, so a hostile frame is refused after a fraction of a second of scanning.
- `unpack_bounded` / `unpack_all_bounded` decode msgpack after that check; a message of at most
  `TINY_BYTES` (a token's frame), or of at most `SMALL_BYTES` without a 16- or 32-bit array or map
  header, cannot exceed the allowance and decodes at once.
- `json_cost_problem` does the same for a JSON document, before `json.loads`, from a count of
  its brackets, separators and quotes.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack
from msgpack import unpackb

from ..errors import FrameTooLargeError

__all__ = [
    "DECODE_ALLOWANCE_BYTES",
    "DECODE_BYTES_PER_BYTE",
    "SMALL_BYTES",
    "TINY_BYTES",
    "decode_budget",
    "json_cost_problem",
    "msgpack_cost",
    "unpack_all_bounded",
    "unpack_bounded",
]

DECODE_BYTES_PER_BYTE = 5
DECODE_ALLOWANCE_BYTES = 8 * 1024 * 1024
# no shape is charged more than ~85 bytes per byte (a one-entry map, 3 bytes, is charged 256)
# except arrays and maps whose 16- or 32-bit length msgpack allocates before their items come: a
# message this small without such a header byte stays within the allowance whatever it holds,
# so it is decoded unwalked
SMALL_BYTES = 64 * 1024
_LONG_HEADER = re.compile(rb"[\xdc-\xdf]")  # array16/32, map16/32 (or payload bytes like them)
# msgpack refuses a length longer than the message (its default limits), so a message of n bytes
# holds at most n / 3 such headers, each taking at most 192 + 64 n bytes (a map of n entries), and
# ~85 bytes a byte of anything else: 5.7 MiB at 512 bytes, under the allowance whatever the bytes
# are. A token's frame (20-40 bytes) is decoded without even looking for those headers.
TINY_BYTES = 512

# What one decoded object takes (CPython 3.10–3.13, rounded up to pymalloc's 16 bytes).
_LIST, _POINTER = 64, 8  # a list: its header and a pointer per item (msgpack sizes it exactly)
_DICT, _ENTRY = 192, 64  # a dict of n entries: at most 192 + 64 n, its growth's old table too
_STR, _WIDE_STR, _WIDE = 64, 96, 5  # a str: its header and its text; beyond ASCII, decoding
# takes up to five bytes per byte (a buffer of one byte per character, then one of four)
_BYTES = 48  # a bytes' header
_EXT = 128  # an ExtType (or Timestamp) and its data's header
_SCALAR_PER_BYTE = 12  # an int of 3 bytes or more (28–36 bytes) or a float (24): 12 per byte
_NARROW_SCALAR = 36  # a negative fixint or an int8 (one or two bytes): charged 36 a byte
_CHUNK = 64 * 1024  # a run is charged a chunk at a time, so a costly one stops early

# Scalars, in runs: those that take nothing beyond their parent's pointer (positive fixints,
# nil, false, true, the interned empty string, uint8: cached ints), then any other int or float.
_FREE = rb"[\x00-\x7f\xa0\xc0\xc2\xc3]|\xcc."
_SCALARS = _FREE + rb"|[\xe0-\xff]|\xd0.|[\xcd\xd1]..|[\xca\xce\xd2]....|[\xcb\xcf\xd3].{8}"
_FREE_RUN = re.compile(b"(?:" + _FREE + b")+", re.DOTALL)
_SCALAR_RUN = re.compile(b"(?:" + _SCALARS + b")+", re.DOTALL)
_SCALAR_HEADS = frozenset([*range(0x80), 0xA0, 0xC0, 0xC2, 0xC3, *range(0xCA, 0xD4), *range(0xE0, 0x100)])
_NARROW_HEADS = bytes([0xD0, *range(0xE0, 0x100)])  # and any payload byte like them: counted too
_HEADER_RUN = re.compile(rb"[\x80-\x9f]+")  # fixmap and fixarray headers (their items follow)
_MAP_HEADS = bytes(range(0x80, 0x90))
_NON_ASCII = re.compile(rb"[\x80-\xff]")

# head byte → how many bytes after it hold a length, for the kinds whose length follows the head
_LENGTH_BYTES = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}
_LENGTH_BYTES |= {0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _scalars_cost(run: bytes) -> int:
    """What a run of scalars takes beyond its parent's pointers (an upper bound)."""
    narrow = len(run) - len(run.translate(None, _NARROW_HEADS))
    return _SCALAR_PER_BYTE * len(run) + _NARROW_SCALAR * narrow


def _headers_cost(run: bytes) -> int:
    """What a run of fixarray and fixmap headers takes: each list or dict, without its items."""
    arrays = run.translate(None, _MAP_HEADS)
    maps = len(run) - len(arrays)
    array_items = sum(arrays) - 0x90 * len(arrays)
    map_items = sum(run) - sum(arrays) - 0x80 * maps
    return _LIST * len(arrays) + _POINTER * array_items + _DICT * maps + _ENTRY * map_items


def _text_cost(data: bytes | bytearray | memoryview, start: int, stop: int) -> int:
    length = stop - start
    if _NON_ASCII.search(data, start, stop) is None:
        return _STR + length
    return _WIDE_STR + _WIDE * length


def decode_budget(size: int) -> int:
    """The most a message of ``size`` bytes may take decoded: five times its size, or 8 MiB.

    Example:
        >>> decode_budget(4 << 20) == 20 << 20, decode_budget(100) == 8 << 20
        (True, True)
    """
    return max(DECODE_BYTES_PER_BYTE * size, DECODE_ALLOWANCE_BYTES)


def _too_costly(size: int, budget: int) -> FrameTooLargeError:
    return FrameTooLargeError(
        f"a message of {size} bytes would take more than {budget} bytes to decode "
        f"(at most {DECODE_BYTES_PER_BYTE}× its size, or {DECODE_ALLOWANCE_BYTES >> 20} MiB); it was refused"
    )


def msgpack_cost(data: bytes | bytearray | memoryview, budget: int | None = None) -> int:
    """The bytes the msgpack items in ``data`` take once decoded (an upper bound), read without
    decoding them; past ``budget`` (default: `decode_budget` of its size) `FrameTooLargeError`
    is raised as soon as the walk gets there. Malformed data is left for msgpack to refuse.

    Example:
        >>> msgpack_cost(msgpack.packb([300, "hi", {}]))
        382
        >>> msgpack_cost(msgpack.packb([{}] * 1000), budget=10_000)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.FrameTooLargeError: a message of 1003 bytes would take more than 10000 bytes to decode (at most 5× its size, or 8 MiB); it was refused
    """
    size = len(data)
    if budget is None:
        budget = decode_budget(size)
    scalar_run, free_run, header_run = _SCALAR_RUN.match, _FREE_RUN.match, _HEADER_RUN.match
    cost = pos = 0
    while pos < size:
        head = data[pos]
        if head in _SCALAR_HEADS:
            run = scalar_run(data, pos, pos + _CHUNK)
            if run is None:  # an item cut short: msgpack says so
                break
            end = run.end()
            free = free_run(data, pos, end)
            if free is None or free.end() < end:  # not all free
                cost += _scalars_cost(bytes(data[pos:end]))
            pos = end
        elif 0x80 <= head <= 0x9F:
            end = header_run(data, pos, pos + _CHUNK).end()  # type: ignore[union-attr]  # head matches
            cost += _headers_cost(bytes(data[pos:end]))
            pos = end
        elif 0xA1 <= head <= 0xBF:  # fixstr
            start = pos + 1
            pos = start + (head & 0x1F)
            cost += _text_cost(data, start, min(pos, size))
        elif head in _FIXEXT:
            cost += _EXT + _FIXEXT[head]
            pos += 2 + _FIXEXT[head]
        else:
            width = _LENGTH_BYTES.get(head, 0)
            start = pos + 1 + width
            if not width or start > size:  # 0xc1 (never used) or a length cut short
                break
            length = int.from_bytes(data[pos + 1 : start], "big")
            if head >= 0xDC:  # array16/32, map16/32: the items follow
                cost += _LIST + _POINTER * length if head <= 0xDD else _DICT + _ENTRY * length
                pos = start
            elif head >= 0xD9:  # str8/16/32
                pos = start + length
                cost += _text_cost(data, start, min(pos, size))
            elif head >= 0xC7:  # ext8/16/32: a type byte, then the data
                cost += _EXT + length
                pos = start + 1 + length
            else:  # bin8/16/32
                cost += _BYTES + length
                pos = start + length
        if cost > budget:
            raise _too_costly(size, budget)
    return cost


def _walk_unless_small(data: bytes | bytearray | memoryview) -> None:
    """`msgpack_cost` (refusing what is over budget), skipped for a message of at most
    `TINY_BYTES`, or of at most `SMALL_BYTES` without a byte of a 16- or 32-bit array or map header."""
    size = len(data)
    if size <= TINY_BYTES:
        return
    if size > SMALL_BYTES or _LONG_HEADER.search(data) is not None:
        msgpack_cost(data)


def unpack_bounded(data: bytes | bytearray | memoryview, *, strict_map_key: bool = True) -> Any:
    """Decode one msgpack value; one that would take more than its `decode_budget` raises
    `FrameTooLargeError` before anything is built (``strict_map_key=False`` allows map keys
    other than str and bytes).

    Example:
        >>> unpack_bounded(msgpack.packb([1, {"a": "b"}]))
        [1, {'a': 'b'}]
        >>> unpack_bounded(msgpack.packb([{}] * 200_000))
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.FrameTooLargeError: a message of 200005 bytes would take more than 8388608 bytes to decode (at most 5× its size, or 8 MiB); it was refused
    """
    _walk_unless_small(data)
    try:
        return unpackb(data, raw=False, strict_map_key=strict_map_key)
    except msgpack.StackError:
        raise FrameTooLargeError("a message nests arrays or maps too deeply; it was refused") from None


def unpack_all_bounded(data: bytes) -> list[Any]:
    """Decode every msgpack value in ``data`` (NATS carries several frames in one message), with
    one budget for all of them.

    Example:
        >>> unpack_all_bounded(msgpack.packb([11, 7]) + msgpack.packb([10, 7, "x"]))
        [[11, 7], [10, 7, 'x']]
    """
    _walk_unless_small(data)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        return list(unpacker)
    except msgpack.StackError:
        raise FrameTooLargeError("a message nests arrays or maps too deeply; it was refused") from None


# -- JSON

# A string, or an unclosed one to the end: every match that starts at a quote succeeds, so the
# scan is linear (a pattern that could fail there would rescan the rest from each quote).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_JSON_LIST = 88  # a list built by appends: its header and spare room, its pointer
_JSON_OBJECT = 208  # a dict of a few entries (184 bytes) and its pointer, json's key memo
_ASTRAL = re.compile(rb"[\xf0-\xf4]")  # UTF-8's lead bytes of characters beyond U+FFFF
_BEYOND_LATIN1 = re.compile(rb"[\xc4-\xef]")  # and of those from U+0100 to U+FFFF
_JSON_VALUE = 48  # a number (a 36-byte int at most, or a float) and its pointer, or a dict entry


def _json_text_bytes(raw: bytes) -> int:
    """What ``json.loads`` takes for ``raw``'s text: the decoded document and the strings parsed
    out of it, each one, two or four bytes a character (the widest character decides), and
    the narrower buffer UTF-8 decoding starts with."""
    size = len(raw)
    if raw.isascii():
        return 2 * size if b"\\u" not in raw else 9 * size  # an escape may be any character
    if b"\\u" in raw or _ASTRAL.search(raw) is not None:
        return 9 * size
    if _BEYOND_LATIN1.search(raw) is not None:
        return 5 * size
    return 3 * size


def json_cost_problem(raw: bytes) -> str | None:
    """Why ``raw`` (a JSON document) must not be decoded, or None: a large body whose arrays,
    objects, values and text would take more than its `decode_budget`.

    Each bracket is charged a container, each comma or colon a value, each quote half a string's
    header, and the text twice (the document, then its strings; wider when it has characters
    beyond ASCII). Separators and brackets inside strings are counted only when they would
    matter (so prose full of commas passes).

    Example:
        >>> json_cost_problem(b'{"prompt": "hi"}') is None
        True
        >>> json_cost_problem(b"[" + b"[]," * 100_000 + b"[]]")
        'the body of 300004 bytes would take 14200232 bytes to decode, more than 8388608: send fewer arrays, objects and values, or a shorter text'
    """
    size = len(raw)
    if size <= SMALL_BYTES:
        return None
    if b"\x00" in raw:  # UTF-16 or UTF-32, which json.loads also takes: counted as bytes, wrongly
        return f"the body of {size} bytes is not UTF-8: send JSON as UTF-8"
    budget = decode_budget(size)
    text = _json_text_bytes(raw)
    structure = raw
    for _ in range(2):  # the counts in the raw bytes first, then outside strings
        lists, objects = structure.count(b"["), structure.count(b"{")
        values = structure.count(b",") + structure.count(b":") + 1
        quotes = raw.count(b'"')
        cost = _JSON_LIST * lists + _JSON_OBJECT * objects + _JSON_VALUE * values + _STR // 2 * quotes + text
        if cost <= budget:
            return None
        if structure is not raw:
            break
        structure = _JSON_STRING.sub(b"", raw)
    return (
        f"the body of {size} bytes would take {cost} bytes to decode, more than {budget}: "
        "send fewer arrays, objects and values, or a shorter text"
    )
