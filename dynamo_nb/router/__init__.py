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
  fallback paths);
- ``server_load.py``: `ServerLoads`, the load a worker's own server reports (an upstream
  worker's), which least-loaded and KV routing add to what they routed.

`make_router` builds the router a frontend's ``--router-mode`` names.

Example:
    >>> ROUTER_MODES
    ('round-robin', 'random', 'least-loaded', 'kv')
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .base import DirectRouter, RandomRouter, RoundRobinRouter, Route, RoutedStream, Router, RoutingClient
from .decision import NO_TICKET, Candidate, RoutingDecision, RoutingRecords, RoutingTicket
from .function import FunctionRouter, PickFunction
from .kv import KvRoute, KvRouter, KvRouterConfig
from .kv.indexer import RadixTree
from .least_loaded import LeastLoadedRouter
from .prefill_planner import DISAGG_PATHS, PrefillPlan, PrefillPlanner
from .server_load import ServerLoad, ServerLoads

if TYPE_CHECKING:
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
    "RoutingClient",
    "RoutingDecision",
    "RoutingRecords",
    "RoutingTicket",
    "ServerLoad",
    "ServerLoads",
    "build_router",
    "check_router_mode",
    "make_router",
]

ROUTER_MODES = ("round-robin", "random", "least-loaded", "kv")


def check_router_mode(mode: str) -> str:
    """``mode`` if it is one of `ROUTER_MODES`, else a `ConfigError` naming them."""
    if mode not in ROUTER_MODES:
        raise ConfigError(f"unknown router mode {mode!r}: use one of {', '.join(ROUTER_MODES)}")
    return mode


def build_router(
    mode: str,
    client: RoutingClient,
    *,
    block_size: int = 16,
    kv_config: KvRouterConfig | None = None,
    limit_of: Callable[[int], int | None] | None = None,
    rng: random.Random | None = None,
    tree: RadixTree | None = None,
) -> Router:
    """The router for ``mode`` (one of `ROUTER_MODES`) over ``client`` (any `RoutingClient`),
    following nothing yet: the one place a mode becomes a router. ``limit_of`` gives an
    instance's limit on requests in flight (least-loaded); ``rng`` draws for least-loaded and
    KV; ``tree`` is the KV router's radix tree when the caller feeds it the workers' KV events
    (a replay)."""
    if check_router_mode(mode) == "round-robin":
        return RoundRobinRouter(client)
    if mode == "random":
        return RandomRouter(client)
    if mode == "least-loaded":
        return LeastLoadedRouter(client, limit_of, rng)
    return KvRouter(client, block_size, kv_config, rng, tree=tree)


async def make_router(
    mode: str,
    client: RoutingClient,
    *,
    block_size: int = 16,
    kv_config: KvRouterConfig | None = None,
    component: Component | None = None,
    limit_of: Callable[[int], int | None] | None = None,
    server_loads: ServerLoads | None = None,
) -> Router:
    """`build_router`, then a KV router follows ``component``'s KV events (unless ``kv_config``
    turns them off) and shares its decisions (``kv_config.replica_sync``); least-loaded and KV
    routers add what ``server_loads`` reports (other modes stop it).

    Example::

        router = await make_router("kv", client, block_size=16, component=endpoint.component())
    """
    router = build_router(mode, client, block_size=block_size, kv_config=kv_config, limit_of=limit_of)
    if isinstance(router, KvRouter):
        await router.follow(component)
    if server_loads is not None:
        if router.tracks_requests:  # a router that counts load (least-loaded, KV) adds the servers'
            router.follow_server_loads(server_loads)
        else:
            await server_loads.stop()
    return router
