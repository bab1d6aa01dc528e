"""The engines' KV cache: a block manager with prefix reuse and KV events, and the ``hf`` prefix cache.

Example:
    >>> from dynamo_nb.engines.kv_cache import KvBlockManager
    >>> kv = KvBlockManager(num_blocks=4, block_size=2)
    >>> kv.allocate([1, 2, 3, 4]).cached_blocks
    0
"""

from __future__ import annotations

from .blocks import Allocation, KvBlockManager, publish_kv_events
from .prefix import PrefixCache, PrefixHit

__all__ = ["Allocation", "KvBlockManager", "PrefixCache", "PrefixHit", "publish_kv_events"]
