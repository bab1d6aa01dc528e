"""The ``hf`` engine's prefix cache: the KV tensors of full prompt blocks, reused by later prompts.

Blocks are Dynamo's (full blocks of ``block_size`` tokens, chained sequence hashes), kept by a
`KvBlockManager` with LRU eviction, so the cache emits the same ``stored`` / ``removed``
KV events as the mocker and a KV router can follow it. For a new prompt, `PrefixCache.begin`
finds the longest cached prefix and returns a KV cache holding it (at most the prompt minus
one token: the model must still see the last one to give logits); the engine runs the model on
the rest, then `PrefixCache.finish` copies the prompt's new full blocks into the cache.

Thread-safe: the engine's model thread calls `begin` / `finish`, the event loop `snapshot`
and `drain_events`.

Example::

    cache = PrefixCache(num_blocks=1024, block_size=16, model_config=model.config)
    hit = cache.begin(prompt)               # hit.reused tokens come from the cache
    forward_with_cache(model, hit.past, input_ids=prompt[hit.reused:])
    cache.finish(hit, hit.past)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .blocks import Allocation, KvBlockManager

__all__ = ["PrefixCache", "PrefixHit"]


@dataclass
class PrefixHit:
    """What `PrefixCache.begin` found: ``reused`` prompt tokens whose KV is in ``past`` (a
    DynamicCache, empty when nothing was cached)."""

    prompt: list[int]
    reused: int
    past: Any
    allocation: Allocation | None


class PrefixCache:
    """See the module docstring.

    Attributes:
        prefix_hits, prompt_blocks: cached and total full prompt blocks of the prompts it saw.
    """

    def __init__(self, num_blocks: int, block_size: int, model_config: Any) -> None:
        self.blocks = KvBlockManager(num_blocks, block_size, on_evict=self._drop)
        self.block_size = block_size
        self.model_config = model_config
        self.prefix_hits = 0
        self.prompt_blocks = 0
        self._tensors: dict[int, list[tuple[Any, Any]]] = {}  # sequence hash → per layer (keys, values)
        self._lock = threading.Lock()

    def begin(self, prompt: list[int]) -> PrefixHit:
        """The longest cached prefix of ``prompt`` as a DynamicCache; its blocks are held until `finish`."""
        import torch
        from transformers import DynamicCache

        with self._lock:
            hashes = self.blocks.hashes(prompt)
            allocation = (
                self.blocks.allocate(prompt, hashes) if self.blocks.can_allocate(prompt, hashes) else None
            )
            cached = allocation.cached_blocks if allocation is not None else 0
            self.prefix_hits += cached
            self.prompt_blocks += len(hashes[1])
            reused = min(cached * self.block_size, len(prompt) - 1)
            if reused <= 0:
                return PrefixHit(prompt, 0, DynamicCache(config=self.model_config), allocation)
            blocks = [self._tensors[seq] for seq in hashes[1][: -(-reused // self.block_size)]]
        layers = []
        for layer in range(len(blocks[0])):
            keys = torch.cat([block[layer][0] for block in blocks], dim=2)[:, :, :reused]
            values = torch.cat([block[layer][1] for block in blocks], dim=2)[:, :, :reused]
            layers.append((keys, values))
        return PrefixHit(
            prompt, reused, DynamicCache(ddp_cache_data=layers, config=self.model_config), allocation
        )

    def finish(self, hit: PrefixHit, cache: Any) -> None:
        """The prompt's prefill is done and ``cache`` holds its KV: keep its new full blocks."""
        allocation = hit.allocation
        if allocation is None:
            return
        size = self.block_size
        full = len(hit.prompt) // size
        with self._lock:
            for i in range(allocation.cached_blocks, full):
                self._tensors[allocation.sequence[i]] = [
                    (
                        layer.keys[:, :, i * size : (i + 1) * size].clone(),
                        layer.values[:, :, i * size : (i + 1) * size].clone(),
                    )
                    for layer in cache.layers
                ]
            self.blocks.mark_computed(allocation, full * size)
            self.blocks.release(allocation)
        hit.allocation = None

    def abandon(self, hit: PrefixHit) -> None:
        """The prefill failed: let its blocks go without caching anything new."""
        if hit.allocation is not None:
            with self._lock:
                self.blocks.release(hit.allocation)
            hit.allocation = None

    def _drop(self, sequence_hash: int) -> None:
        self._tensors.pop(sequence_hash, None)

    def drain_events(self) -> list[Any]:
        """The KV events (``stored`` / ``removed``) since the last call."""
        with self._lock:
            return self.blocks.drain_events()

    def snapshot(self) -> list[Any]:
        """Events that rebuild the whole cache from empty (served at ``kv_sync``)."""
        with self._lock:
            return self.blocks.snapshot()

    @property
    def cached_blocks(self) -> int:
        return len(self._tensors)
