"""The KV router's choice: the cost of sending a request to each worker, and the pick.

For each candidate worker (as in Dynamo's ``selector.rs``):

- ``prefill_blocks = (active prefill tokens + prompt tokens − overlap_score_credit × the prefix
  it already holds (overlap × block_size)) / block_size``: with the default credit 1, the
  prompt's new tokens;
- ``decode_blocks`` = the worker's distinct active blocks with this request added (blocks a
  running request already uses there, such as a shared system prompt, count once); where the
  worker's own server reports its load (`dynamo_nb.router.server_load`), the blocks it says are
  in use when that is more, or, where it says only its request counts, each request it runs
  that the router did not send counted as large as this prompt (``server_blocks``);
- ``cost = prefill_load_scale × prefill_blocks + decode_blocks`` — lower is better
  (`dynamo_nb.router.policy.RouterPolicy` holds the knobs).

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
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...errors import NoInstancesError

__all__ = ["ActiveLoad", "cost_parts", "costs", "pick"]

W = TypeVar("W", bound=Hashable)  # a worker's id (an instance id, or any name in tests)


@dataclass
class ActiveLoad:
    """What a worker is busy with, from the router's own decisions.

    Attributes:
        prefill_tokens: prompt tokens routed to it whose prefill has not finished.
        blocks: the KV blocks (sequence hashes) its running requests use, each counted once
            however many requests share it — a shared system prompt is one set of blocks.
    """

    prefill_tokens: int = 0
    blocks: Counter[int] = field(default_factory=Counter)
    requests: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def decode_blocks(self) -> int:
        """Distinct KV blocks in use."""
        return len(self.blocks)

    def new_blocks(self, sequence: Sequence[int]) -> int:
        """How many of ``sequence``'s blocks are not in use here yet."""
        return len(set(sequence).difference(self.blocks))

    def add(self, request_id: str, new_tokens: int, sequence: Sequence[int]) -> None:
        """A request was routed here: ``new_tokens`` to prefill, the blocks ``sequence`` to hold."""
        self.requests[request_id] = (new_tokens, tuple(sequence))
        self.prefill_tokens += new_tokens
        self.blocks.update(sequence)

    def prefill_done(self, request_id: str) -> None:
        """Its first token came back: its prompt is no longer waiting for prefill."""
        tokens, sequence = self.requests.get(request_id, (0, ()))
        if tokens:
            self.prefill_tokens -= tokens
            self.requests[request_id] = (0, sequence)

    def free(self, request_id: str) -> None:
        """It finished: its blocks are released (those shared with running requests stay)."""
        tokens, sequence = self.requests.pop(request_id, (0, ()))
        self.prefill_tokens -= tokens
        blocks = self.blocks
        for block in sequence:
            left = blocks[block] - 1
            if left > 0:
                blocks[block] = left
            else:
                del blocks[block]


def cost_parts(
    workers: Sequence[W],
    *,
    prompt_tokens: int,
    block_size: int,
    overlaps: Mapping[W, int],
    loads: Mapping[W, ActiveLoad],
    overlap_score_credit: float = 1.0,
    prefill_load_scale: float = 1.0,
    sequence: Sequence[int] | None = None,
    server_blocks: Mapping[W, float] | None = None,
) -> dict[W, dict[str, float]]:
    """Each worker's cost for a prompt of ``prompt_tokens`` with the parts it is made of
    (``overlap_blocks`` and the ``prefix_tokens`` they hold, ``new_prefill_tokens``,
    ``active_prefill_tokens``, ``prefill_blocks``, ``decode_blocks``, ``cost``; see the module docstring).

    With the prompt's block ``sequence`` hashes, blocks already in use on a worker (a shared
    prefix of a running request) add no decode load there; without it, the overlap is subtracted.
    ``server_blocks``: the blocks a worker's server says are in use (see the module docstring).
    """
    request_blocks = math.ceil(prompt_tokens / block_size)
    result = {}
    for worker in workers:
        overlap = overlaps.get(worker, 0)
        load = loads.get(worker) or ActiveLoad()
        new_tokens = max(prompt_tokens - overlap * block_size, 0)
        credited = prompt_tokens - overlap_score_credit * overlap * block_size
        if overlap_score_credit <= 1:  # never below nothing to compute (a partial last block)
            credited = max(credited, 0)
        prefill_blocks = (load.prefill_tokens + credited) / block_size
        added = load.new_blocks(sequence) if sequence is not None else request_blocks - overlap
        in_use = float(load.decode_blocks)
        reported = server_blocks.get(worker) if server_blocks else None
        if reported is not None:
            in_use = max(in_use, reported)
        decode_blocks = in_use + added
        result[worker] = {
            "overlap_blocks": overlap,
            "prefix_tokens": overlap * block_size,
            "new_prefill_tokens": new_tokens,
            "active_prefill_tokens": load.prefill_tokens,
            "prefill_blocks": prefill_blocks,
            "decode_blocks": decode_blocks,
            "cost": prefill_load_scale * prefill_blocks + decode_blocks,
        }
        if reported is not None:
            result[worker]["server_blocks"] = reported
    return result


def costs(workers: Sequence[W], **options: Any) -> dict[W, float]:
    """The cost of each worker: `cost_parts` (same arguments) without the parts."""
    return {worker: parts["cost"] for worker, parts in cost_parts(workers, **options).items()}


def pick(
    worker_costs: Mapping[W, float],
    *,
    temperature: float = 0.0,
    tree_sizes: Mapping[W, int] | None = None,
    rng: random.Random | None = None,
) -> W:
    """The chosen worker: the cheapest at temperature 0, else a softmax draw."""
    if not worker_costs:
        raise NoInstancesError("no workers to choose from")
    draw = rng.choice if rng is not None else random.choice
    draw_weighted = rng.choices if rng is not None else random.choices
    if temperature <= 0:
        best = min(worker_costs.values())
        tied = [w for w, c in worker_costs.items() if c == best]
        if len(tied) > 1 and tree_sizes:
            smallest = min(tree_sizes.get(w, 0) for w in tied)
            tied = [w for w in tied if tree_sizes.get(w, 0) == smallest]
        return tied[0] if len(tied) == 1 else draw(tied)
    low, high = min(worker_costs.values()), max(worker_costs.values())
    span = (high - low) or 1.0
    workers = list(worker_costs)
    weights = [math.exp(-(worker_costs[w] - low) / span / temperature) for w in workers]
    return draw_weighted(workers, weights=weights, k=1)[0]
