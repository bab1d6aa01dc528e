"""KV-aware routing: Dynamo's block hashes, the radix-tree indexer and the worker choice.

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
