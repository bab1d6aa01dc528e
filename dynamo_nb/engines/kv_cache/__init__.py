"""The engines' KV cache: a block manager with prefix reuse and KV events, and the ``hf`` prefix cache.

- ``blocks.py``: `KvBlockManager`, prompt blocks by sequence hash, prefix reuse, LRU eviction and
  KV events (the mocker's pool, and the bookkeeping of the ``hf`` prefix cache);
- ``prefix.py``: `PrefixCache`, the ``hf`` engine's KV tensors of full prompt blocks, reused by
  later prompts;
- ``zmq_relay.py``: `ZmqKvRelay`, vLLM's and SGLang's ZMQ KV events relayed to our KV router.

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
