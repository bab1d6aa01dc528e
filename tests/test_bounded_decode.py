"""The decode budget: a message's decoded size is charged from its bytes, an upper bound of what
decoding really takes (measured with tracemalloc), and a message over five times its size (or
8 MiB when it is small) is refused before anything is built; legitimate large messages pass."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamo_nb.errors import FrameTooLargeError
from dynamo_nb.runtime.bounded_decode import (
    DECODE_ALLOWANCE_BYTES,
    decode_budget,
    json_cost_problem,
    msgpack_cost,
    unpack_all_bounded,
    unpack_bounded,
)

MB = 1 << 20


def decode_peak(data: bytes) -> int:
    """Bytes decoding ``data`` allocated at its peak."""
    tracemalloc.start()
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del value
    return peak


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=30) | st.dictionaries(st.text(max_size=8), inner, max_size=30),
    max_leaves=400,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_the_charge_is_at_least_what_decoding_takes(value: Any) -> None:
    data = msgpack.packb(value)
    assert msgpack_cost(data, budget=1 << 40) >= decode_peak(data) - 64  # tracemalloc's own few bytes


HOSTILE = {  # each about 4 MiB: what one byte or two of each shape costs Python
    "empty maps": [{}] * (4 * MB),
    "empty lists": [[]] * (4 * MB),
    "negative fixints": [-20] * (4 * MB),
    "two-character strings": ["ab"] * (4 * MB // 3),
    "one emoji each": ["😀"] * (4 * MB // 5),
    "one-entry maps": [{"": None}] * (4 * MB // 3),
    "lists of one": [[-20]] * (2 * MB),
    "16-bit ints": [300] * (4 * MB // 3),
    "small and large ints": [1, 300] * (MB // 2),
}


@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_every_costly_shape_is_refused_before_it_is_decoded(shape: str) -> None:
    data = msgpack.packb(HOSTILE[shape])
    with pytest.raises(FrameTooLargeError, match="would take more than"):
        unpack_bounded(data)
    with pytest.raises(FrameTooLargeError):
        unpack_all_bounded(data + data)
    sample = msgpack.packb(HOSTILE[shape][:20_000])
    assert decode_peak(sample) > 5 * len(sample)  # and the shape really costs more than five times


def test_large_legitimate_messages_pass() -> None:
    prompt = {"token_ids": [300 + i % 31_000 for i in range(150_000)], "model": "m"}
    data = msgpack.packb(prompt)
    assert unpack_bounded(data) == prompt  # 150 K token ids: a 450 KB list, 6 MB as ints
    text = "a plain ASCII text, " * (4 * MB // 20)
    assert unpack_bounded(msgpack.packb(text)) == text
    blob = bytes(range(256)) * (3 * MB // 256)
    assert unpack_bounded(msgpack.packb([blob, blob])) == [blob, blob]


def test_the_budget_is_five_times_the_size_or_the_allowance() -> None:
    assert decode_budget(10) == DECODE_ALLOWANCE_BYTES
    assert decode_budget(4 * MB) == 20 * MB
    wide = "é" * (MB // 2)  # a MB of two-byte characters: five bytes per byte while decoded
    assert msgpack_cost(msgpack.packb(wide)) >= 5 * MB


def test_malformed_data_is_left_to_msgpack() -> None:
    data = msgpack.packb([300] * 100_000)
    with pytest.raises(ValueError):  # cut short
        unpack_bounded(data[:-1])
    with pytest.raises(ValueError):  # 0xc1 is never used
        unpack_bounded(data[:100_000] + b"\xc1" + data[100_000:])


def test_json_bodies_are_charged_before_json_loads() -> None:
    floats = b"[" + b"1.0," * (3 * MB) + b"1.0]"
    problem = json_cost_problem(floats)
    assert problem is not None and "send fewer" in problem
    assert json_cost_problem(b"[" + b"[]," * MB + b"[]]") is not None
    prose = json.dumps({"prompt": "Words, and more words, with commas, " * 150_000}).encode()
    assert json_cost_problem(prose) is None  # 5 MB of prose: its commas inside the string
    latin = json.dumps({"prompt": "é" * (3 * MB)}, ensure_ascii=False).encode()
    assert json_cost_problem(latin) is None  # 6 MB of Latin-1: a byte a character, twice
    emoji = json.dumps({"prompt": "text and an emoji 😀 " * (3 * MB // 22)}, ensure_ascii=False)
    assert json_cost_problem(emoji.encode()) is not None  # four bytes a character: 9× in all
    assert json_cost_problem(emoji[:800_000].encode() + b'"}') is None  # within the allowance


def test_a_small_frame_of_long_array_headers_is_walked_and_refused() -> None:
    # each array16 header makes msgpack allocate its 65535-item list before the items come
    frame = (b"\xdc\xff\xff" * 1023).ljust(65536, b"\x00")
    with pytest.raises(FrameTooLargeError):
        unpack_bounded(frame)
    assert unpack_bounded(msgpack.packb([1, "two", {"three": 3}])) == [1, "two", {"three": 3}]


@pytest.mark.parametrize(
    "unit",
    [b"\xdc\x02\x00", b"\xdd\x00\x00\x02\x00", b"\xde\x02\x00\xa0", b"\xdf\x00\x00\x02\x00\xa0",
     b"\x81\xa0", b"\x91", b"\xd9\xff", b"\xc7\xff\x01"],
    ids=["array16", "array32", "map16", "map32", "fixmap", "fixarray", "str8", "ext8"],
)  # fmt: skip
def test_a_tiny_message_decoded_unwalked_stays_within_the_allowance(unit: bytes) -> None:
    """A message of at most TINY_BYTES is decoded without the walk: even made only of the
    costliest headers, nested as deep as it goes, it takes less than the allowance."""
    import tracemalloc

    from dynamo_nb.runtime.bounded_decode import DECODE_ALLOWANCE_BYTES, TINY_BYTES

    frame = (unit * (TINY_BYTES // len(unit) + 1))[:TINY_BYTES]
    tracemalloc.start()
    try:
        with pytest.raises((ValueError, UnicodeDecodeError)):  # cut short: msgpack says so
            unpack_bounded(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0 < peak < DECODE_ALLOWANCE_BYTES, peak


def test_a_json_body_that_is_not_utf8_is_refused() -> None:
    body = ('["\u2200",' + "[]," * 200_000 + '"x"]').encode("utf-16-le")
    problem = json_cost_problem(body)
    assert problem is not None and "not UTF-8" in problem
