"""The KV router's choice: the cost of sending a request to each worker, and the pick.

For each candidate worker (as in Dynamo's ``selector.rs``):

- ``prefill_blocks = (active prefill tokens + this request's new tokens) / block_size``, where
  the new tokens are the prompt minus what the worker already holds (``overlap × block_size``);
- ``decode_blocks`` = the worker's active blocks with this request added;
- ``cost = overlap_weight × prefill_blocks + decode_blocks`` — lower is better.

Temperature 0 picks the cheapest (ties: the smallest cache, then at random); otherwise a
softmax over the normalized negated costs.

Example (Dynamo's worked example: costs 18, 10 and 11, the second worker wins):
    >>> costs = {"a": 18.0, "b": 10.0, "c": 11.0}
    >>> pick(costs, temperature=0.0)
    'b'
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ActiveLoad", "costs", "pick"]


@dataclass
class ActiveLoad:
    """What a worker is busy with, from the router's own decisions.

    Attributes:
        prefill_tokens: prompt tokens routed to it whose prefill has not finished.
        decode_blocks: KV blocks of the requests it is running.
    """

    prefill_tokens: int = 0
    decode_blocks: int = 0
    requests: dict[str, tuple[int, int]] = field(default_factory=dict)  # id → (prefill tokens, blocks)

    def add(self, request_id: str, new_tokens: int, blocks: int) -> None:
        """A request was routed here: ``new_tokens`` to prefill, ``blocks`` to hold."""
        self.requests[request_id] = (new_tokens, blocks)
        self.prefill_tokens += new_tokens
        self.decode_blocks += blocks

    def prefill_done(self, request_id: str) -> None:
        """Its first token came back: its prompt is no longer waiting for prefill."""
        tokens, blocks = self.requests.get(request_id, (0, 0))
        if tokens:
            self.prefill_tokens -= tokens
            self.requests[request_id] = (0, blocks)

    def free(self, request_id: str) -> None:
        """It finished: its blocks are no longer active."""
        tokens, blocks = self.requests.pop(request_id, (0, 0))
        self.prefill_tokens -= tokens
        self.decode_blocks -= blocks


def costs(
    workers: Sequence[Hashable],
    *,
    prompt_tokens: int,
    block_size: int,
    overlaps: Mapping[Hashable, int],
    loads: Mapping[Hashable, ActiveLoad],
    overlap_weight: float = 1.0,
) -> dict[Hashable, float]:
    """The cost of each worker for a prompt of ``prompt_tokens`` (see the module docstring)."""
    request_blocks = math.ceil(prompt_tokens / block_size)
    result = {}
    for worker in workers:
        overlap = overlaps.get(worker, 0)
        load = loads.get(worker) or ActiveLoad()
        new_tokens = max(prompt_tokens - overlap * block_size, 0)
        prefill_blocks = (load.prefill_tokens + new_tokens) / block_size
        decode_blocks = load.decode_blocks + request_blocks - overlap
        result[worker] = overlap_weight * prefill_blocks + decode_blocks
    return result


def pick(
    worker_costs: Mapping[Hashable, float],
    *,
    temperature: float = 0.0,
    tree_sizes: Mapping[Hashable, int] | None = None,
    rng: random.Random | None = None,
) -> Hashable:
    """The chosen worker: the cheapest at temperature 0, else a softmax draw."""
    if not worker_costs:
        raise ValueError("no workers to choose from")
    rng = rng or random
    if temperature <= 0:
        best = min(worker_costs.values())
        tied = [w for w, c in worker_costs.items() if c == best]
        if len(tied) > 1 and tree_sizes:
            smallest = min(tree_sizes.get(w, 0) for w in tied)
            tied = [w for w in tied if tree_sizes.get(w, 0) == smallest]
        return tied[0] if len(tied) == 1 else rng.choice(tied)
    low, high = min(worker_costs.values()), max(worker_costs.values())
    span = (high - low) or 1.0
    workers = list(worker_costs)
    weights = [math.exp(-(worker_costs[w] - low) / span / temperature) for w in workers]
    return rng.choices(workers, weights=weights, k=1)[0]
