"""Load-aware picking without KV events: the less busy of two instances drawn at random.

`LeastLoadedRouter` counts the requests it has in flight on each instance (from `open` until
the stream ends) and picks by the power of two choices (as SMG and Envoy do): two instances
at random, the one with fewer requests in flight. An instance at its limit (the card's
``max_num_seqs``) is skipped while any other has room, so a busy worker is passed over
before it is overloaded; when every instance is full it still picks the least loaded (the
frontend's admission control decides whether the request waits or gets a 503). Where a worker's
own server reports its load (`dynamo_nb.router.server_load`: an upstream worker in front of a
server others use too), the requests that server runs and this router did not send count as well.

Example:
    >>> import asyncio
    >>> from dynamo_nb import DistributedRuntime
    >>> from dynamo_nb.engines import EchoEngine
    >>> from dynamo_nb.llm import PreprocessedRequest, engine_handler
    >>> async def main():
    ...     async with await DistributedRuntime.create() as rt:
    ...         endpoint = rt.endpoint("demo.least.generate")
    ...         await endpoint.serve(engine_handler(EchoEngine().generate))
    ...         router = LeastLoadedRouter(await endpoint.client())
    ...         route = router.pick(PreprocessedRequest(token_ids=[5]))
    ...         busy = router.inflight[route.instance_id]
    ...         router.finished(route)
    ...         return busy, router.inflight[route.instance_id]
    >>> asyncio.run(main())
    (1, 0)
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable

from ..llm.protocol import PreprocessedRequest
from .base import Route, Router, RoutingClient
from .decision import NO_TICKET, Candidate, RoutingTicket

__all__ = ["LeastLoadedRouter"]


class LeastLoadedRouter(Router):
    """The less busy of two random instances, skipping instances at their limit (see the module docstring).

    Attributes:
        inflight: requests this router has in flight per instance id.
        limit_of: an instance's limit on requests in flight (None: no limit).
    """

    tracks_requests = True
    name = "least-loaded"

    def __init__(
        self,
        client: RoutingClient,
        limit_of: Callable[[int], int | None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``rng`` draws the two instances compared (a seeded one makes a replay repeatable)."""
        super().__init__(client)
        self.inflight: defaultdict[int, int] = defaultdict(int)
        self.limit_of = limit_of or (lambda _instance: None)
        self._random = rng or random.Random()

    def routed_to(self, instance_id: int) -> int:
        return self.inflight.get(instance_id, 0)

    def load(self, instance_id: int) -> int:
        """Requests on ``instance_id``: this router's in flight, and what its server runs for others."""
        return self.inflight.get(instance_id, 0) + (self.others_on(instance_id) or 0)

    def _has_room(self, instance_id: int) -> bool:
        limit = self.limit_of(instance_id)
        return limit is None or self.load(instance_id) < limit

    def pick(self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET) -> Route:
        ids = self.client.available_ids()
        open_ids = [i for i in ids if self._has_room(i)] or ids
        drawn = self._random.sample(open_ids, min(2, len(open_ids)))
        chosen = min(drawn, key=self.load)
        candidates = self._candidates(ids, open_ids, drawn)
        rule = "fewer in flight of two drawn at random"
        if self.server_loads is not None:
            rule = "fewer requests (in flight from here, and others on its server) of two drawn at random"
        route = Route(chosen, decision=self.decision(chosen, rule, candidates, ticket=ticket))
        self.inflight[chosen] += 1
        return route

    def _candidates(self, ids: list[int], open_ids: list[int], drawn: list[int]) -> list[Candidate]:
        """Each instance with its requests in flight (and limit); why those not compared were not."""
        candidates = []
        for i in ids:
            limit = self.limit_of(i)
            parts: dict[str, float] = {"inflight": self.inflight.get(i, 0)}
            others = self.others_on(i)
            if others is not None:
                parts["server_others"] = others
            if limit is not None:
                parts["limit"] = limit
            excluded = None
            if i not in open_ids:
                excluded = f"at its limit ({self.load(i)} of {limit} in flight)"
            elif i not in drawn:
                excluded = f"not drawn (two of {len(open_ids)} are compared)"
            candidates.append(Candidate(i, score=self.load(i), parts=parts, excluded=excluded))
        return candidates

    def finished(self, route: Route) -> None:
        left = self.inflight[route.instance_id] - 1
        if left > 0:
            self.inflight[route.instance_id] = left
        else:
            self.inflight.pop(route.instance_id, None)
