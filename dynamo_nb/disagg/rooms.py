"""Bootstrap rooms and the (host, port, room, token) that join a prefill to its decode.

A prefill worker's bootstrap server parks the KV cache of a prompt under a *room*; the
decode worker fetches it from ``bootstrap_host:bootstrap_port`` by the same room. Rooms are
random 63-bit integers (as in Dynamo and SGLang), drawn by the frontend's prefill router on
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
from dataclasses import dataclass
from typing import Any

from ..errors import DisaggregationError

__all__ = ["MAX_ROOM", "BootstrapInfo", "check_token", "draw_room", "draw_token"]

MAX_ROOM = 2**63 - 1
_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
MAX_TOKEN_CHARS = 128


def draw_room() -> int:
    """A random room in ``0..2**63-1`` (from the OS's CSPRNG: no collisions between processes)."""
    return secrets.randbelow(MAX_ROOM + 1)


def draw_token() -> str:
    """A room's token: 128 random bits from the OS's CSPRNG, as 32 hex digits."""
    return secrets.token_hex(16)


def check_token(token: Any, what: str = "bootstrap_info") -> str:
    """``token`` if it can be a room's token (a string of 1..128 characters), else `DisaggregationError`."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
        raise DisaggregationError(
            f"{what}.bootstrap_token must be a string of 1..{MAX_TOKEN_CHARS} characters"
        )
    return token


@dataclass(frozen=True)
class BootstrapInfo:
    """Where a decode fetches its KV cache: the prefill's bootstrap server, the room, and the
    room's token (None only for engines whose own bootstrap has no tokens)."""

    host: str
    port: int
    room: int
    token: str | None = None

    @classmethod
    def parse(cls, data: Any, what: str = "disaggregated_params") -> BootstrapInfo:
        """Check ``{bootstrap_host, bootstrap_port, bootstrap_room}``; `DisaggregationError` names what is wrong."""
        if not isinstance(data, dict):
            raise DisaggregationError(f"{what} must be an object with {', '.join(_KEYS)}, got {data!r}")
        missing = [key for key in _KEYS if data.get(key) is None]
        if missing:
            raise DisaggregationError(f"{what} lacks {', '.join(missing)} (it has {sorted(data)})")
        host, port, room = (data[key] for key in _KEYS)
        if not isinstance(host, str) or not host:
            raise DisaggregationError(f"{what}.bootstrap_host must be a host name, got {host!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise DisaggregationError(f"{what}.bootstrap_port must be a port number, got {port!r}")
        if not isinstance(room, int) or isinstance(room, bool) or not 0 <= room <= MAX_ROOM:
            raise DisaggregationError(f"{what}.bootstrap_room must be an integer in 0..2**63-1, got {room!r}")
        token = data.get("bootstrap_token")
        return cls(host, port, room, None if token is None else check_token(token, what))

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"bootstrap_host", "bootstrap_port", "bootstrap_room"}`` and
        ``bootstrap_token`` when there is one."""
        out: dict[str, Any] = {
            "bootstrap_host": self.host,
            "bootstrap_port": self.port,
            "bootstrap_room": self.room,
        }
        if self.token is not None:
            out["bootstrap_token"] = self.token
        return out
