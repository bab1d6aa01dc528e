"""The KV router: send each request to the worker with the best cost (KV overlap vs load).

For a request's token ids it hashes the full blocks, asks the indexer how many leading blocks
each worker already holds, adds the load the router itself has routed to each worker, and
picks with `dynamo_nb.router.kv.selector`. The indexer is fed by the workers' KV events
(`KvIndexer`), or, in approximate mode (no events), by the router's own decisions: the blocks
of a routed request are assumed cached on that worker for ``approx_ttl`` seconds. With events,
a routed prompt also counts as cached on its worker for ``pending_ttl`` seconds or until the
worker's stored event confirms it, so requests that follow it closely find it too.

It is a `dynamo_nb.router.Router`: `pick` returns a `KvRoute` (the worker, the blocks it held,
the costs), and the stream `open` returns tells it when the prefill is done and when the
request ended, so the load it counts stays right.

Example::

    router = await KvRouter.create(client, block_size=16, component=endpoint.component())
    stream = router.send(PreprocessedRequest(token_ids=ids))
"""

from __future__ import annotations

import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import ConfigError, NoInstancesError
from ...llm.protocol import PreprocessedRequest
from ...runtime.ids import new_request_id
from ...settings import Settings, nested, setting
from ..base import Route, Router, RoutingClient
from ..decision import NO_TICKET, Candidate, RoutingTicket
from ..policy import RouterPolicy
from .hashing import block_hashes, sequence_hashes
from .indexer import RadixTree
from .kv_events import KvIndexer
from .replica_sync import ReplicaSync
from .selector import ActiveLoad, cost_parts, pick

if TYPE_CHECKING:
    from ...runtime.distributed import Component

__all__ = ["KvRoute", "KvRouter", "KvRouterConfig"]


SEEN_BLOCKS = 1 << 20  # blocks a router remembers having routed (for the reuse funnel's seen_before)


@dataclass(frozen=True)
class KvRouterConfig(Settings):
    """The KV router's settings: its starting `RouterPolicy` (three knobs, each a flag),
    approximate mode (no KV events) and replica sync (`dynamo_nb.router.kv.replica_sync`).

    Example:
        >>> KvRouterConfig(replica_sync=None).replica_sync is None   # None: the frontend decides
        True
    """

    policy: RouterPolicy = nested(RouterPolicy)
    use_kv_events: bool = setting(
        True,
        flag="--no-kv-events",
        negate=True,
        group="kv router",
        default_text="off",
        help="approximate mode, no KV events; routed blocks count as cached for a while",
    )
    approx_ttl: float = 120.0
    pending_ttl: float = 5.0  # with events: a routed prompt counts as cached there until its event comes
    replica_sync: bool | None = setting(
        None,
        flag="--router-replica-sync",
        group="kv router",
        default_text="on for --http-workers N with --nats-url, else off",
        help="share routing decisions (load, pending prefixes) with the other frontends' routers over the "
        "event plane, so N frontends route as well as one",
    )


@dataclass
class KvRoute(Route):
    """Where a request went and why: the blocks its worker already held, the prompt's blocks, the costs."""

    overlap_blocks: int = 0
    prompt_blocks: int = 0
    costs: dict[int, float] = field(default_factory=dict)


class KvRouter(Router):
    """See the module docstring; create it with `KvRouter.create`.

    Attributes:
        policy: the `RouterPolicy` it decides by; assign a new one to change it (each decision
            reads it once, so a change applies between two decisions).
        loads: per worker, what the router has routed there and is still running.
        decisions: how many requests it routed; ``hit_blocks`` / ``prompt_blocks_total``
            is its prefix hit rate.
    """

    tracks_requests = True
    name = "kv"

    def __init__(
        self,
        client: RoutingClient,
        block_size: int,
        config: KvRouterConfig | None = None,
        rng: random.Random | None = None,
        *,
        tree: RadixTree | None = None,
    ) -> None:
        """A router that follows nothing yet: `follow` starts its KV events (`KvRouter.create`
        does both); or give the ``tree`` you feed with the workers' KV events yourself (a replay
        does, on its simulated clock)."""
        super().__init__(client)
        self.block_size = block_size
        self.config = config or KvRouterConfig()
        self.policy = self.config.policy
        self.indexer: KvIndexer | None = None
        self.tree = tree or RadixTree()
        self.follows_events = tree is not None
        self.loads: dict[int, ActiveLoad] = {}
        self.decisions = 0
        self.hit_blocks = 0
        self.prompt_blocks_total = 0
        self._rng = rng or random.Random()
        self._seen: OrderedDict[int, None] = OrderedDict()  # blocks routed before, newest last (bounded)
        self.sync: ReplicaSync | None = None  # set by `follow` with ``config.replica_sync``

    @classmethod
    async def create(
        cls,
        client: RoutingClient,
        block_size: int,
        config: KvRouterConfig | None = None,
        *,
        component: Component | None = None,
    ) -> KvRouter:
        """A router for ``client``'s endpoint that follows ``component`` (see `follow`)."""
        router = cls(client, block_size, config)
        await router.follow(component)
        return router

    async def follow(self, component: Component | None) -> None:
        """Listen to ``component``'s KV events (unless ``config.use_kv_events`` is off), and with
        ``config.replica_sync`` share decisions with the endpoint's other routers."""
        config = self.config
        if config.use_kv_events and component is not None:
            self.indexer = await KvIndexer.start(component, self.tree)
            self.follows_events = True
        if config.replica_sync:
            if component is None:
                raise ConfigError(
                    "replica sync shares decisions over the component's event plane: give component="
                )
            self.sync = await ReplicaSync.start(component, self, self.client.endpoint.name)

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> KvRoute:
        """The worker for ``request``'s prompt; the request counts on it until `finished`."""
        return self.choose(request.token_ids, ticket=ticket)

    def choose(
        self, token_ids: list[int], request_id: str | None = None, *, ticket: RoutingTicket = NO_TICKET
    ) -> KvRoute:
        """Pick the worker for ``token_ids`` and count the request on it (see `finished`)."""
        started = time.perf_counter()
        hashes = block_hashes(token_ids, self.block_size)
        sequence = sequence_hashes(hashes)
        return self.choose_blocks(
            hashes, sequence, len(token_ids), request_id, started=started, ticket=ticket
        )

    def choose_blocks(
        self,
        hashes: list[int],
        sequence: list[int],
        prompt_tokens: int,
        request_id: str | None = None,
        *,
        started: float | None = None,
        ticket: RoutingTicket = NO_TICKET,
    ) -> KvRoute:
        """`choose` for a prompt of ``prompt_tokens`` tokens given as its blocks' local ``hashes``
        and ``sequence`` hashes (a replayed trace has no token ids)."""
        request_id = request_id or new_request_id()
        live = set(self.client.instance_ids())
        if not live:
            path = str(self.client.endpoint.path)
            raise NoInstancesError(f"no instance of {path} to route to", endpoint=path)
        hashed = time.perf_counter()
        started = hashed if started is None else started
        if self.indexer is not None:
            self.indexer.prune(live)
        self.tree.expire()
        matches = self.tree.find_matches(hashes)
        matched = time.perf_counter()
        policy = self.policy  # one policy for the whole decision, however it changes meanwhile
        parts = cost_parts(
            sorted(live),
            prompt_tokens=prompt_tokens,
            block_size=self.block_size,
            overlaps=matches.scores,
            loads=self.loads,
            overlap_score_credit=policy.overlap_score_credit,
            prefill_load_scale=policy.prefill_load_scale,
            sequence=sequence,
            server_blocks=self._server_blocks(live, prompt_tokens) if self.server_loads is not None else None,
        )
        worker_costs = {w: p["cost"] for w, p in parts.items()}
        temperature = policy.temperature
        worker = int(
            pick(worker_costs, temperature=temperature, tree_sizes=matches.tree_sizes, rng=self._rng)
        )
        rule = (
            "lowest cost"
            if temperature <= 0
            else f"drawn by a softmax of the costs at temperature {temperature:g}"
        )
        others = [cost for w, cost in worker_costs.items() if w != worker]
        if temperature <= 0 and others and min(others) == worker_costs[worker]:
            rule += ", the tie broken by the smaller cache, then at random"
        candidates = [Candidate(int(w), score=p["cost"], parts=p) for w, p in parts.items()]
        done = time.perf_counter()
        decision = self.decision(
            worker,
            rule,
            candidates,
            ticket=ticket,
            seen_before_tokens=self._seen_before(sequence) * self.block_size,
            policy=policy.to_dict(),
            overhead_ms={
                "block_hashing": (hashed - started) * 1000,
                "indexer_find_matches": (matched - hashed) * 1000,
                "scheduling": (done - matched) * 1000,
                "total": (done - started) * 1000,
            },
        )
        overlap = matches.scores.get(worker, 0)
        new_tokens = max(prompt_tokens - overlap * self.block_size, 0)
        self.loads.setdefault(worker, ActiveLoad()).add(request_id, new_tokens, sequence)
        if self.sync is not None:
            self.sync.added(request_id, worker, new_tokens, hashes, sequence)
        # the chosen worker will hold this prompt: count it now (approximate mode), or until the
        # worker's stored event confirms it (events mode), so the next same-prefix request follows
        ttl = self.config.pending_ttl if self.follows_events else self.config.approx_ttl
        self.tree.insert(worker, hashes, ttl, block_ids=sequence)
        self.decisions += 1
        self.hit_blocks += overlap
        self.prompt_blocks_total += len(hashes)
        return KvRoute(
            worker,
            request_id,
            overlap,
            len(hashes),
            worker_costs,
            decision=decision,
        )

    def routed_to(self, instance_id: int) -> int:
        load = self.loads.get(instance_id)
        return len(load.requests) if load is not None else 0

    def _server_blocks(self, live: set[int], prompt_tokens: int) -> dict[int, float]:
        """The blocks each worker's server says are in use: its KV usage where it gives its size,
        else what this router routed there plus a prompt's worth for each request it did not send."""
        assert self.server_loads is not None
        result = {}
        for worker in live:
            load = self.server_loads.get(worker)
            if load is None:
                continue
            in_use = load.blocks_in_use
            if in_use is None:
                own = self.loads.get(worker)
                in_use = (own.decode_blocks if own else 0) + load.others * math.ceil(
                    prompt_tokens / self.block_size
                )
            result[worker] = in_use
        return result

    def _seen_before(self, sequence: list[int]) -> int:
        """How many leading blocks of ``sequence`` this router sent somewhere before; then remember them."""
        seen = self._seen
        known = 0
        for block in sequence:
            if block not in seen:
                break
            known += 1
        for block in sequence:
            seen[block] = None
            seen.move_to_end(block)
        while len(seen) > SEEN_BLOCKS:
            seen.popitem(last=False)
        return known

    def first_token(self, route: Route) -> None:
        """The request's prefill is done on its worker."""
        load = self.loads.get(route.instance_id)
        if load is not None:
            load.prefill_done(route.request_id)
            if self.sync is not None:
                self.sync.prefill_done(route.request_id, route.instance_id)

    def finished(self, route: Route) -> None:
        """The request ended (or failed) on its worker."""
        load = self.loads.get(route.instance_id)
        if load is not None:
            load.free(route.request_id)
            if self.sync is not None:
                self.sync.freed(route.request_id, route.instance_id)

    @property
    def hit_rate(self) -> float:
        """Prompt blocks found cached on the chosen worker, over all prompt blocks routed."""
        return self.hit_blocks / self.prompt_blocks_total if self.prompt_blocks_total else 0.0

    async def stop(self) -> None:
        await super().stop()
        if self.sync is not None:
            await self.sync.stop()
        if self.indexer is not None:
            await self.indexer.stop()
