"""Disaggregated prefill/decode: everything about the handoff from a prefill to its decode.

- ``roles.py``: the `DisaggregatedEngine` contract (an engine's prefill and decode roles);
- ``prefill.py``: the prefill side, where a prefill parks its KV (`BootstrapRole`, `prefill_stream`);
- ``decode.py``: the decode side, where a decode fetches its KV (`fetch_prompt_kv`) and
  `DecodeHandler`, a decode worker that asks a prefill worker itself when needed;
- ``rooms.py``: bootstrap rooms (`draw_room`, `draw_token`; the typed `BootstrapInfo` is
  `dynamo_nb.llm.bootstrap_info`'s);
- ``bootstrap.py``: the prefill's `BootstrapServer`, where KV caches wait for their decode, and
  `fetch_kv`, its client;
- ``kv_wire.py``: the KV payload (a JSON header and raw tensor bytes, checked on arrival);
- ``modes.py``: `WorkerRole`, what a worker's ``--mode`` makes of its engine;
- ``handoff.py``: sending a prefill, awaiting its params, draining it — shared by the frontend's
  prefill planner and the decode handler.

Example:
    >>> from dynamo_nb.disagg import BootstrapInfo, draw_room
    >>> info = BootstrapInfo("127.0.0.1", 7000, draw_room())
    >>> sorted(info.to_dict())
    ['bootstrap_host', 'bootstrap_port', 'bootstrap_room']
"""

from __future__ import annotations

from .bootstrap import BootstrapServer, fetch_kv
from .decode import DecodeHandler, fetch_prompt_kv
from .kv_wire import KV_FORMAT, KVLayout, check_header, pack_kv, unpack_kv
from .modes import WorkerRole
from .prefill import BootstrapRole
from .roles import DisaggregatedEngine
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
