"""Routing: which instance serves a request.

- ``base.py``: the `Router` protocol (pick an instance, open the stream there, hear when it
  ends) with `RoundRobinRouter`, `RandomRouter` and `DirectRouter`;
- ``function.py``: `FunctionRouter`, routing by a plain function ``pick(request, instance_ids)``
  (a policy written in a notebook cell; `Frontend.set_router` plugs it in);
- ``least_loaded.py``: `LeastLoadedRouter`, the less busy of two random instances (skipping
  instances at their ``max_num_seqs``);
- ``kv/``: the KV-aware router (Dynamo's block hashes, the radix-tree indexer fed by KV
  events, the cost function) — `KvRouter`;
- ``policy.py``: `RouterPolicy`, the KV router's knobs with Dynamo 1.7's names, changed live;
- ``decision.py``: `RoutingDecision`, why a request went where it did (every router records
  one), and `RoutingRecords`, the frontend's ring of the last ones;
- ``prefill_planner.py``: `PrefillPlanner`, the prefill half of disaggregated serving (fast and
  fallback paths).

`make_router` builds the router a frontend's ``--router-mode`` names.

Example:
    >>> ROUTER_MODES
    ('round-robin', 'random', 'least-loaded', 'kv')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .base import DirectRouter, RandomRouter, RoundRobinRouter, Route, RoutedStream, Router
from .decision import NO_TICKET, Candidate, RoutingDecision, RoutingRecords, RoutingTicket
from .function import FunctionRouter, PickFunction
from .kv import KvRoute, KvRouter, KvRouterConfig
from .least_loaded import LeastLoadedRouter
from .prefill_planner import DISAGG_PATHS, PrefillPlan, PrefillPlanner

if TYPE_CHECKING:
    from ..runtime.client import Client
    from ..runtime.distributed import Component

__all__ = [
    "DISAGG_PATHS",
    "NO_TICKET",
    "ROUTER_MODES",
    "Candidate",
    "DirectRouter",
    "FunctionRouter",
    "KvRoute",
    "KvRouter",
    "KvRouterConfig",
    "LeastLoadedRouter",
    "PickFunction",
    "PrefillPlan",
    "PrefillPlanner",
    "RandomRouter",
    "RoundRobinRouter",
    "Route",
    "RoutedStream",
    "Router",
    "RoutingDecision",
    "RoutingRecords",
    "RoutingTicket",
    "check_router_mode",
    "make_router",
]

ROUTER_MODES = ("round-robin", "random", "least-loaded", "kv")


def check_router_mode(mode: str) -> str:
    """``mode`` if it is one of `ROUTER_MODES`, else a `ConfigError` naming them."""
    if mode not in ROUTER_MODES:
        raise ConfigError(f"unknown router mode {mode!r}: use one of {', '.join(ROUTER_MODES)}")
    return mode


async def make_router(
    mode: str,
    client: Client,
    *,
    block_size: int = 16,
    kv_config: KvRouterConfig | None = None,
    component: Component | None = None,
    limit_of: Callable[[int], int | None] | None = None,
) -> Router:
    """The router for ``mode`` (one of `ROUTER_MODES`) over ``client``'s endpoint; the KV router
    follows ``component``'s KV events (unless ``kv_config`` turns them off); ``limit_of`` gives
    an instance's limit on requests in flight (least-loaded)."""
    if check_router_mode(mode) == "round-robin":
        return RoundRobinRouter(client)
    if mode == "random":
        return RandomRouter(client)
    if mode == "least-loaded":
        return LeastLoadedRouter(client, limit_of)
    return await KvRouter.create(client, block_size, kv_config, component=component)
