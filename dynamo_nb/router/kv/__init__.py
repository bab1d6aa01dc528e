"""KV-aware routing: Dynamo's block hashes, the radix-tree indexer and the worker choice.

- ``router.py``: `KvRouter` (hash the prompt, ask the indexer, add the load, pick) and its config;
- ``hashing.py``: Dynamo's block hashes (`block_hashes`, `sequence_hashes`);
- ``indexer.py``: `RadixTree`, which worker holds which cached prefix;
- ``kv_events.py``: KV events between workers and routers (`KvEventPublisher`, `KvIndexer`),
  numbered, with gap repair;
- ``selector.py``: the cost of each worker and the pick (`costs`, `pick`, `ActiveLoad`);
- ``replica_sync.py``: `ReplicaSync`, decisions shared between the KV routers of several frontends.

Example:
    >>> from dynamo_nb.router.kv import RadixTree, block_hashes
    >>> index = RadixTree()
    >>> hashes = block_hashes(list(range(32)), block_size=16)
    >>> index.insert("w1", hashes, ttl=60)                # approximate mode: a routing decision
    >>> index.find_matches(hashes).scores
    {'w1': 2}
"""

from __future__ import annotations

from .hashing import HASH_SEED, block_hashes, sequence_hashes
from .indexer import OverlapScores, RadixTree
from .kv_events import KV_EVENTS_TOPIC, KV_SYNC_ENDPOINT, KvEventPublisher, KvIndexer
from .replica_sync import SYNC_TOPIC_PREFIX, ReplicaSync
from .router import KvRoute, KvRouter, KvRouterConfig
from .selector import ActiveLoad, costs, pick

__all__ = [
    "HASH_SEED",
    "KV_EVENTS_TOPIC",
    "KV_SYNC_ENDPOINT",
    "SYNC_TOPIC_PREFIX",
    "ActiveLoad",
    "KvEventPublisher",
    "KvIndexer",
    "KvRoute",
    "KvRouter",
    "KvRouterConfig",
    "OverlapScores",
    "RadixTree",
    "ReplicaSync",
    "block_hashes",
    "costs",
    "pick",
    "sequence_hashes",
]
