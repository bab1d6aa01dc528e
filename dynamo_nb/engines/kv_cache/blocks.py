"""A KV block manager: prompt blocks by sequence hash, prefix reuse, LRU eviction, KV events.

The mocker's simulated pool, and the bookkeeping of the ``hf`` engine's prefix cache.

A request's full prompt blocks are looked up by sequence hash: the leading ones already
computed are reused (their reference count goes up), the rest are allocated — evicting the
least recently used unreferenced blocks when the pool is full. A new block joins the prefix
cache once its tokens are computed (`mark_computed`, as the engine's prefill chunks finish):
that emits a ``stored`` event; blocks evicted in a row emit one ``removed`` event (block id =
sequence hash, content key = local hash), exactly what the KV router's indexer consumes.
Finished requests release their blocks, which stay cached until evicted; a block released
before it was computed is dropped without an event.

Example:
    >>> kv = KvBlockManager(num_blocks=8, block_size=4)
    >>> first = kv.allocate(list(range(12)))
    >>> kv.mark_computed(first, 12)
    >>> first.cached_blocks, kv.allocate(list(range(12))).cached_blocks
    (0, 3)
    >>> [next(iter(e)) for e in kv.drain_events()]
    ['stored']
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError, EngineError
from ...router.kv.hashing import block_hashes, sequence_hashes

__all__ = ["Allocation", "KvBlockManager", "publish_kv_events"]

logger = logging.getLogger("dynamo_nb.engines")


async def publish_kv_events(publish: Callable[[Any], Awaitable[Any]] | None, events: list[Any]) -> int:
    """Send an engine's drained KV events; a failed send is logged, not raised (the event id it
    took makes a gap, and the router re-syncs from ``kv_sync``), so the engine's loop goes on.
    Returns how many were sent."""
    if publish is None:
        return 0
    sent = 0
    for event in events:
        try:
            await publish(event)
            sent += 1
        except Exception:
            logger.warning("could not publish a KV event; routers will re-sync", exc_info=True)
    return sent


@dataclass
class _Block:
    local: int
    parent: int | None
    refs: int = 0
    computed: bool = False


@dataclass
class Allocation:
    """A request's blocks: the first ``cached_blocks`` were computed already (a prefix hit);
    `KvBlockManager.mark_computed` has covered the first ``computed_blocks``."""

    sequence: list[int] = field(default_factory=list)
    cached_blocks: int = 0
    computed_blocks: int = 0
    token_ids: list[int] | None = None  # the prompt, for events that carry their blocks' tokens


class KvBlockManager:
    """See the module docstring."""

    def __init__(
        self, num_blocks: int, block_size: int, *, on_evict: Callable[[int], None] | None = None
    ) -> None:
        """``on_evict(sequence_hash)`` is told of every evicted block (to free what it held)."""
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(
                f"num_blocks and block_size must be at least 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._blocks: dict[int, _Block] = {}  # sequence hash → block, in creation order
        self._free: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, oldest first
        self._events: list[Any] = []
        self._on_evict = on_evict
        #: ``stored`` events also carry their blocks' ``token_ids`` (what NVIDIA Dynamo's KV
        #: publisher hashes itself); off by default: the kit's router needs only the hashes
        self.event_token_ids = False

    @property
    def used_blocks(self) -> int:
        return len(self._blocks)

    @property
    def active_blocks(self) -> int:
        """Blocks referenced by running requests."""
        return len(self._blocks) - len(self._free)

    def hashes(self, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """The prompt's local block hashes and sequence hashes (compute once, pass to the calls below)."""
        locals_ = block_hashes(token_ids, self.block_size)
        return locals_, sequence_hashes(locals_)

    def can_allocate(self, token_ids: list[int], hashes: tuple[list[int], list[int]] | None = None) -> bool:
        """Whether the prompt's new blocks fit (evicting unreferenced ones if needed)."""
        _, sequence = hashes or self.hashes(token_ids)
        free = self._free
        needed = sum(1 for s in sequence if s not in self._blocks or s in free)
        return needed <= self.num_blocks - self.active_blocks

    def allocate(self, token_ids: list[int], hashes: tuple[list[int], list[int]] | None = None) -> Allocation:
        """Reference the prompt's blocks, reusing the computed prefix; evicts (and says so) to make room."""
        locals_, sequence = hashes or self.hashes(token_ids)
        allocation = Allocation(sequence, token_ids=token_ids)
        prefix = True
        for i, (seq, local) in enumerate(zip(sequence, locals_, strict=True)):
            block = self._blocks.get(seq)
            if block is None:
                if len(self._blocks) >= self.num_blocks:
                    self._evict_one()
                block = self._blocks[seq] = _Block(local, sequence[i - 1] if i else None)
            else:
                self._free.pop(seq, None)
            prefix = prefix and block.computed
            if prefix:
                allocation.cached_blocks += 1
            block.refs += 1
        allocation.computed_blocks = allocation.cached_blocks
        return allocation

    def mark_computed(self, allocation: Allocation, tokens: int) -> None:
        """The first ``tokens`` prompt tokens of ``allocation`` are computed: their full blocks join the
        prefix cache (one ``stored`` event per run of blocks that were not cached yet)."""
        upto = min(tokens // self.block_size, len(allocation.sequence))
        run: list[dict[str, int]] = []
        run_parent: int | None = None
        run_start = 0
        for i in range(allocation.computed_blocks, upto):
            block = self._blocks[allocation.sequence[i]]
            if block.computed:  # another request computed it meanwhile
                self._flush(run, run_parent, allocation, run_start)
                run = []
                continue
            block.computed = True
            if not run:
                run_parent, run_start = block.parent, i
            run.append({"block_hash": allocation.sequence[i], "tokens_hash": block.local})
        self._flush(run, run_parent, allocation, run_start)
        allocation.computed_blocks = max(upto, allocation.computed_blocks)

    def _flush(
        self, run: list[dict[str, int]], parent: int | None, allocation: Allocation, start: int
    ) -> None:
        if not run:
            return
        stored: dict[str, Any] = {"parent_hash": parent, "blocks": run}
        if self.event_token_ids and allocation.token_ids is not None:
            size = self.block_size
            stored["token_ids"] = allocation.token_ids[start * size : (start + len(run)) * size]
        self._events.append({"stored": stored})

    def release(self, allocation: Allocation) -> None:
        """The request ended: its computed blocks stay cached, evictable once nobody references them.

        They join the eviction order tail first (as vLLM frees them), so a prefix is evicted from
        its end and never leaves cached blocks behind that no prompt can reach.
        """
        for seq in reversed(allocation.sequence):
            block = self._blocks.get(seq)
            if block is not None and block.refs > 0:
                block.refs -= 1
                if block.refs == 0:
                    if block.computed:
                        self._free[seq] = None
                    else:  # never computed, never announced
                        del self._blocks[seq]

    def _evict_one(self) -> None:
        if not self._free:
            raise EngineError(
                "the KV cache is full of blocks in use (allocate only what can_allocate allows)"
            )
        seq, _ = self._free.popitem(last=False)
        del self._blocks[seq]
        if self._on_evict is not None:
            self._on_evict(seq)
        last = self._events[-1] if self._events else None
        if isinstance(last, dict) and "removed" in last:  # consecutive evictions: one event
            last["removed"]["block_hashes"].append(seq)
        else:
            self._events.append({"removed": {"block_hashes": [seq]}})

    def drain_events(self) -> list[Any]:
        """The KV events since the last call, in order."""
        events, self._events = self._events, []
        return events

    def snapshot(self) -> list[Any]:
        """Events that rebuild the whole cache from empty (for a router's re-sync)."""
        return [
            {
                "stored": {
                    "parent_hash": block.parent,
                    "blocks": [{"block_hash": seq, "tokens_hash": block.local}],
                }
            }
            for seq, block in self._blocks.items()
            if block.computed
        ]
