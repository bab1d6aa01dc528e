"""Bootstrap rooms and the (host, port, room, token) that join a prefill to its decode (the
typed `BootstrapInfo` lives with the request it travels in, `dynamo_nb.llm.bootstrap_info`).

A prefill worker's bootstrap server parks the KV cache of a prompt under a *room*; the
decode worker fetches it from ``bootstrap_host:bootstrap_port`` by the same room. Rooms are
random 63-bit integers (as in Dynamo and SGLang), drawn by the frontend's prefill planner on
the fast path or by the prefill worker itself. A *token* (128 random bits, drawn with the
room) travels with it: the bootstrap server hands a KV cache only to a caller that presents
both, so knowing (or guessing) a room is not enough to read another request's KV.

Example:
    >>> room = draw_room()
    >>> 0 <= room <= MAX_ROOM
    True
    >>> BootstrapInfo.parse({"bootstrap_host": "127.0.0.1", "bootstrap_port": 7000, "bootstrap_room": 5})
    BootstrapInfo(host='127.0.0.1', port=7000, room=5, token=None)
    >>> len(draw_token())
    32
"""

from __future__ import annotations

import secrets

from ..llm.bootstrap_info import MAX_ROOM, BootstrapInfo, check_token

__all__ = ["MAX_ROOM", "BootstrapInfo", "check_token", "draw_room", "draw_token"]


def draw_room() -> int:
    """A random room in ``0..2**63-1`` (from the OS's CSPRNG: no collisions between processes)."""
    return secrets.randbelow(MAX_ROOM + 1)


def draw_token() -> str:
    """A room's token: 128 random bits from the OS's CSPRNG, as 32 hex digits."""
    return secrets.token_hex(16)
