"""The radix-tree indexer: which worker holds which cached prefix, from KV events.

The tree is keyed by the chain of local block hashes (see `dynamo_nb.router.kv.hashing`); each node
holds the set of workers that have that block *with that whole prefix*. Workers describe
their caches with events:

- ``{"stored": {"parent_hash": h | None, "blocks": [{"block_hash": b, "tokens_hash": t}, …]}}``
  — blocks appended after the worker's block ``parent_hash`` (None: from the root);
- ``{"removed": {"block_hashes": [b, …]}}`` — blocks evicted;
- ``"cleared"`` — the whole cache dropped.

``block_hash`` is the worker's own id for a block (parent links and removals use it),
``tokens_hash`` the content hash that keys the tree. `find_matches` walks a request's local
hashes and scores every worker by the number of consecutive prefix blocks it holds.

Approximate mode (no events): `insert` records the blocks a request was routed with, with an
expiry; `expire` drops what is older.

Example:
    >>> index = RadixTree()
    >>> index.apply_event(7, {"stored": {"parent_hash": None,
    ...     "blocks": [{"block_hash": 1, "tokens_hash": 11}, {"block_hash": 2, "tokens_hash": 22}]}})
    >>> index.find_matches([11, 22, 33]).scores
    {7: 2}
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ProtocolError
from .hashing import sequence_hashes

__all__ = ["OverlapScores", "RadixTree"]

Worker = Hashable


@dataclass
class OverlapScores:
    """Per worker: consecutive prefix blocks held (``scores``) and blocks held in all (``tree_sizes``)."""

    scores: dict[Any, int] = field(default_factory=dict)
    tree_sizes: dict[Any, int] = field(default_factory=dict)


class _Node:
    __slots__ = ("children", "parent", "tokens_hash", "workers")

    def __init__(self, tokens_hash: int | None, parent: _Node | None) -> None:
        self.tokens_hash = tokens_hash
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.workers: set[Any] = set()


class RadixTree:
    """See the module docstring.

    Attributes:
        events_applied: events that changed the tree.
        events_dropped: ``stored`` events whose parent block the worker never reported (a gap).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` gives the time approximate-mode expiries count in (a replay's is simulated)."""
        self.clock = clock
        self._root = _Node(None, None)
        self._blocks: dict[Any, dict[int, _Node]] = {}  # worker → its block id → node
        self._expiry: dict[tuple[Any, int], float] = {}  # approximate mode: (worker, block id) → deadline
        # the same keys ordered by the deadline they had when pushed (one entry per key; `expire`
        # re-pushes a key whose deadline moved later, and skips keys that left _expiry)
        self._deadlines: list[tuple[float, int, Any, int]] = []
        self._pushed = 0
        self.events_applied = 0
        self.events_dropped = 0

    # -- events

    def apply_event(self, worker: Worker, event: Any) -> None:
        """Apply one KV event of ``worker`` (raises ValueError for one that is not an event)."""
        if event == "cleared" or (isinstance(event, dict) and "cleared" in event):
            self.remove_worker(worker)
        elif isinstance(event, dict) and "stored" in event:
            stored = event["stored"]
            if not self.store(worker, stored.get("parent_hash"), stored.get("blocks") or []):
                self.events_dropped += 1
                return
        elif isinstance(event, dict) and "removed" in event:
            self.remove(worker, event["removed"].get("block_hashes") or [])
        else:
            raise ProtocolError(f"not a KV event (stored, removed or cleared): {event!r}")
        self.events_applied += 1

    def store(self, worker: Worker, parent_hash: int | None, blocks: Sequence[dict[str, int]]) -> bool:
        """Record ``blocks`` held by ``worker`` after its block ``parent_hash``; False if that is unknown."""
        owned = self._blocks.setdefault(worker, {})
        if parent_hash is None:
            node = self._root
        else:
            found = owned.get(parent_hash)
            if found is None:
                return False
            node = found
        for block in blocks:
            tokens_hash = block["tokens_hash"]
            child = node.children.get(tokens_hash)
            if child is None:
                child = node.children[tokens_hash] = _Node(tokens_hash, node)
            child.workers.add(worker)
            owned[block["block_hash"]] = child
            self._expiry.pop((worker, block["block_hash"]), None)  # confirmed by an event: no expiry
            node = child
        return True

    def remove(self, worker: Worker, block_hashes: Sequence[int]) -> None:
        """Forget ``worker``'s blocks ``block_hashes`` (unknown ids are ignored)."""
        owned = self._blocks.get(worker, {})
        for block_hash in block_hashes:
            node = owned.pop(block_hash, None)
            self._expiry.pop((worker, block_hash), None)
            if node is not None:
                node.workers.discard(worker)
                _prune(node)

    def remove_worker(self, worker: Worker) -> None:
        """Drop every block of ``worker`` (it left, or cleared its cache)."""
        for block_hash in list(self._blocks.get(worker, {})):
            self.remove(worker, [block_hash])
        self._blocks.pop(worker, None)

    # -- approximate mode

    def insert(
        self,
        worker: Worker,
        local_hashes: Sequence[int],
        ttl: float,
        now: float | None = None,
        *,
        block_ids: Sequence[int] | None = None,
    ) -> None:
        """Assume ``worker`` now holds these blocks (a routing decision), for ``ttl`` seconds.

        Block ids are the sequence hashes (pass ``block_ids`` when already computed). Blocks
        the worker's events already stored keep no expiry; a later stored event of a
        predicted block (same id) confirms it.
        """
        deadline = (self.clock() if now is None else now) + ttl
        ids = sequence_hashes(local_hashes) if block_ids is None else block_ids  # equal prefixes, equal ids
        owned = self._blocks.get(worker, {})
        expiry = self._expiry
        held = 0  # the leading blocks the worker holds already need no new nodes
        while held < len(ids) and ids[held] in owned:
            if (worker, ids[held]) in expiry:  # predicted before: predicted for longer
                expiry[(worker, ids[held])] = deadline
            held += 1
        if held == len(ids):
            return
        predicted = [b for b in ids[held:] if b not in owned or (worker, b) in expiry]
        self.store(
            worker,
            ids[held - 1] if held else None,
            [
                {"block_hash": b, "tokens_hash": t}
                for b, t in zip(ids[held:], local_hashes[held:], strict=True)
            ],
        )
        for block_hash in predicted:
            if (worker, block_hash) not in expiry:
                self._pushed += 1
                heapq.heappush(self._deadlines, (deadline, self._pushed, worker, block_hash))
            expiry[(worker, block_hash)] = deadline

    def expire(self, now: float | None = None) -> int:
        """Drop the inserted blocks whose time is up; how many went."""
        now = self.clock() if now is None else now
        heap, expiry = self._deadlines, self._expiry
        gone = 0
        while heap and heap[0][0] <= now:
            _, _, worker, block_hash = heapq.heappop(heap)
            deadline = expiry.get((worker, block_hash))
            if deadline is None:  # confirmed by an event, or removed
                continue
            if deadline > now:  # predicted again since: wait for its new deadline
                self._pushed += 1
                heapq.heappush(heap, (deadline, self._pushed, worker, block_hash))
                continue
            self.remove(worker, [block_hash])
            gone += 1
        return gone

    # -- queries

    def find_matches(self, local_hashes: Sequence[int]) -> OverlapScores:
        """Each worker's count of consecutive prefix blocks of ``local_hashes`` it holds."""
        result = OverlapScores()
        scores = result.scores
        node = self._root
        matching: set[Any] | None = None
        depth = 0
        for tokens_hash in local_hashes:
            child = node.children.get(tokens_hash)
            if child is None:
                break
            holders = child.workers
            if matching is None:
                matching = set(holders)
            elif not matching <= holders:  # some workers' prefixes end at the previous block
                for worker in matching - holders:
                    scores[worker] = depth
                matching &= holders
            if not matching:
                break
            depth += 1
            node = child
        for worker in matching or ():
            scores[worker] = depth
        result.tree_sizes = {worker: len(owned) for worker, owned in self._blocks.items() if owned}
        return result

    def workers(self) -> list[Any]:
        """The workers with at least one block."""
        return [worker for worker, owned in self._blocks.items() if owned]

    def block_count(self, worker: Worker | None = None) -> int:
        """Blocks held by ``worker`` (or by all workers together)."""
        if worker is not None:
            return len(self._blocks.get(worker, {}))
        return sum(len(owned) for owned in self._blocks.values())


def _prune(node: _Node) -> None:
    """Remove ``node`` and its empty ancestors once no worker holds them and they lead nowhere."""
    while node.parent is not None and not node.workers and not node.children:
        parent = node.parent
        if node.tokens_hash is not None:
            parent.children.pop(node.tokens_hash, None)
        node = parent
