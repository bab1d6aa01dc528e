"""The KV router: send each request to the worker with the best cost (KV overlap vs load).

For a request's token ids it hashes the full blocks, asks the indexer how many leading blocks
each worker already holds, adds the load the router itself has routed to each worker, and
picks with `dynamo_nb.kv.selector`. The indexer is fed by the workers' KV events
(`KvIndexer`), or, in approximate mode (no events), by the router's own decisions: the blocks
of a routed request are assumed cached on that worker for ``approx_ttl`` seconds. With events,
a routed prompt also counts as cached on its worker for ``pending_ttl`` seconds or until the
worker's stored event confirms it, so requests that follow it closely find it too.

Example:
    >>> router = await KvRouter.create(client, block_size=16)     # doctest: +SKIP
    >>> stream = router.send({"token_ids": ids, ...})               # doctest: +SKIP
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._ids import new_request_id
from ..errors import NoInstancesError
from .events import KvIndexer
from .hashing import block_hashes, sequence_hashes
from .indexer import RadixTree
from .selector import ActiveLoad, costs, pick

if TYPE_CHECKING:
    from .._client import Client, ResponseStream
    from ..runtime import Component

__all__ = ["KvRouter", "KvRouterConfig", "RoutingDecision"]


@dataclass(frozen=True)
class KvRouterConfig:
    """``--kv-overlap-score-weight``, ``--router-temperature``, ``--no-kv-events`` (approximate mode)."""

    overlap_weight: float = 1.0
    temperature: float = 0.0
    use_kv_events: bool = True
    approx_ttl: float = 120.0
    pending_ttl: float = 5.0  # with events: a routed prompt counts as cached there until its event comes


@dataclass(frozen=True)
class RoutingDecision:
    """Where a request went and why: its worker, the blocks it already held there, the prompt's blocks."""

    worker: int
    overlap_blocks: int
    prompt_blocks: int
    costs: dict[int, float]


class KvRouter:
    """See the module docstring; create it with `KvRouter.create`.

    Attributes:
        loads: per worker, what the router has routed there and is still running.
        decisions: how many requests it routed; ``hit_blocks`` / ``prompt_blocks_total``
            is its prefix hit rate.
    """

    def __init__(
        self,
        client: Client,
        block_size: int,
        config: KvRouterConfig,
        indexer: KvIndexer | None,
        rng: random.Random | None = None,
    ) -> None:
        """Use `KvRouter.create`."""
        self.client = client
        self.block_size = block_size
        self.config = config
        self.indexer = indexer
        self.tree = indexer.tree if indexer is not None else RadixTree()
        self.loads: dict[int, ActiveLoad] = {}
        self.decisions = 0
        self.hit_blocks = 0
        self.prompt_blocks_total = 0
        self._rng = rng or random.Random()

    @classmethod
    async def create(
        cls,
        client: Client,
        block_size: int,
        config: KvRouterConfig | None = None,
        *,
        component: Component | None = None,
    ) -> KvRouter:
        """A router for ``client``'s endpoint; with KV events it listens to ``component``'s."""
        config = config or KvRouterConfig()
        indexer = await KvIndexer.start(component) if config.use_kv_events and component is not None else None
        return cls(client, block_size, config, indexer)

    def choose(self, token_ids: list[int], request_id: str) -> RoutingDecision:
        """Pick the worker for ``token_ids`` and count the request on it (see `finished`)."""
        live = set(self.client.instance_ids())
        if not live:
            path = str(self.client.endpoint.path)
            raise NoInstancesError(f"no instance of {path} to route to", endpoint=path)
        if self.indexer is not None:
            self.indexer.prune(live)
        self.tree.expire()
        hashes = block_hashes(token_ids, self.block_size)
        sequence = sequence_hashes(hashes)
        matches = self.tree.find_matches(hashes)
        worker_costs = costs(
            sorted(live),
            prompt_tokens=len(token_ids),
            block_size=self.block_size,
            overlaps=matches.scores,
            loads=self.loads,
            overlap_weight=self.config.overlap_weight,
            sequence=sequence,
        )
        worker = int(
            pick(
                worker_costs,
                temperature=self.config.temperature,
                tree_sizes=matches.tree_sizes,
                rng=self._rng,
            )
        )
        overlap = matches.scores.get(worker, 0)
        new_tokens = max(len(token_ids) - overlap * self.block_size, 0)
        self.loads.setdefault(worker, ActiveLoad()).add(request_id, new_tokens, sequence)
        # the chosen worker will hold this prompt: count it now (approximate mode), or until the
        # worker's stored event confirms it (events mode), so the next same-prefix request follows
        ttl = self.config.pending_ttl if self.indexer is not None else self.config.approx_ttl
        self.tree.insert(worker, hashes, ttl, block_ids=sequence)
        self.decisions += 1
        self.hit_blocks += overlap
        self.prompt_blocks_total += len(hashes)
        return RoutingDecision(worker, overlap, len(hashes), worker_costs)  # type: ignore[arg-type]

    def first_token(self, worker: int, request_id: str) -> None:
        """The request's prefill is done on ``worker``."""
        load = self.loads.get(worker)
        if load is not None:
            load.prefill_done(request_id)

    def finished(self, worker: int, request_id: str) -> None:
        """The request ended (or failed) on ``worker``."""
        load = self.loads.get(worker)
        if load is not None:
            load.free(request_id)

    @property
    def hit_rate(self) -> float:
        """Prompt blocks found cached on the chosen worker, over all prompt blocks routed."""
        return self.hit_blocks / self.prompt_blocks_total if self.prompt_blocks_total else 0.0

    def send(self, request: dict[str, Any]) -> TrackedStream:
        """Route ``request`` (it needs ``token_ids``) to the chosen worker; the stream keeps the load right."""
        request_id = new_request_id()
        decision = self.choose(list(request.get("token_ids") or []), request_id)
        return self.track(self.client.direct(request, decision.worker), decision, request_id)

    def track(self, stream: ResponseStream, decision: RoutingDecision, request_id: str) -> TrackedStream:
        """Wrap the stream of a request routed by `choose`, so its load leaves the worker in time."""
        return TrackedStream(
            stream,
            decision,
            on_first=lambda: self.first_token(decision.worker, request_id),
            on_end=lambda: self.finished(decision.worker, request_id),
        )

    async def stop(self) -> None:
        if self.indexer is not None:
            await self.indexer.stop()


class TrackedStream:
    """A `ResponseStream` that tells the router when its first item came and when it ended."""

    def __init__(
        self,
        stream: ResponseStream,
        decision: RoutingDecision,
        on_first: Callable[[], None],
        on_end: Callable[[], None],
    ) -> None:
        self._stream = stream
        self.decision = decision
        self._on_first: Callable[[], None] | None = on_first
        self._on_end: Callable[[], None] | None = on_end

    @property
    def instance_id(self) -> int:
        return self._stream.instance_id

    @property
    def context(self) -> Any:
        return self._stream.context

    def __aiter__(self) -> TrackedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._stream.__anext__()
        except BaseException:
            self._end()
            raise
        if self._on_first is not None:
            self._on_first()
            self._on_first = None
        return item

    def _end(self) -> None:
        if self._on_end is not None:
            self._on_end()
            self._on_end = None

    async def aclose(self) -> None:
        self._end()
        await self._stream.aclose()
