"""Disaggregated prefill/decode: everything about the handoff from a prefill to its decode.

- ``rooms.py``: bootstrap rooms and `BootstrapInfo` (host, port, room);
- ``bootstrap.py``: the prefill's `BootstrapServer`, where KV caches wait for their decode;
- ``kv_wire.py``: the KV payload (a JSON header and raw tensor bytes, checked on arrival);
- ``roles.py``: the `DisaggregatedEngine` protocol, `BootstrapRole` (an engine's prefill role)
  and `fetch_prompt_kv` (its decode role's fetch);
- ``modes.py``: `WorkerRole`, what a worker's ``--mode`` makes of its engine;
- ``handoff.py``: sending a prefill, awaiting its params, draining it — shared by the frontend's
  prefill router and the decode handler;
- ``decode.py``: `DecodeHandler`, a decode worker that asks a prefill worker itself when needed.

Example:
    >>> from dynamo_nb.disagg import BootstrapInfo, draw_room
    >>> info = BootstrapInfo("127.0.0.1", 7000, draw_room())
    >>> sorted(info.to_dict())
    ['bootstrap_host', 'bootstrap_port', 'bootstrap_room']
"""

from __future__ import annotations

from .bootstrap import BootstrapServer, fetch_kv
from .decode import DecodeHandler
from .kv_wire import KV_FORMAT, KVLayout, check_header, pack_kv, unpack_kv
from .modes import WorkerRole
from .roles import BootstrapRole, DisaggregatedEngine, fetch_prompt_kv
from .rooms import MAX_ROOM, BootstrapInfo, draw_room, draw_token

__all__ = [
    "KV_FORMAT",
    "MAX_ROOM",
    "BootstrapInfo",
    "BootstrapRole",
    "BootstrapServer",
    "DecodeHandler",
    "DisaggregatedEngine",
    "KVLayout",
    "WorkerRole",
    "check_header",
    "draw_room",
    "draw_token",
    "fetch_kv",
    "fetch_prompt_kv",
    "pack_kv",
    "unpack_kv",
]
