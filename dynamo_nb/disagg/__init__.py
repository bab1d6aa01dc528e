"""Disaggregated prefill/decode: bootstrap rooms, the KV wire format and the bootstrap server.

Example:
    >>> from dynamo_nb.disagg import BootstrapInfo, draw_room
    >>> info = BootstrapInfo("127.0.0.1", 7000, draw_room())
    >>> sorted(info.to_dict())
    ['bootstrap_host', 'bootstrap_port', 'bootstrap_room']
"""

from __future__ import annotations

from .bootstrap import BootstrapServer, fetch_kv
from .kv_wire import KV_FORMAT, KVLayout, check_header, pack_kv, unpack_kv
from .rooms import MAX_ROOM, BootstrapInfo, draw_room

__all__ = [
    "KV_FORMAT",
    "MAX_ROOM",
    "BootstrapInfo",
    "BootstrapServer",
    "KVLayout",
    "check_header",
    "draw_room",
    "fetch_kv",
    "pack_kv",
    "unpack_kv",
]
