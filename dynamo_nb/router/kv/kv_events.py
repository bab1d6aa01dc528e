"""KV events between workers and routers, numbered, with gap repair.

A worker's `KvEventPublisher` sends ``{"worker_id", "event_id", "event"}`` on its
component's ``kv_events`` topic, event ids increasing by one, and serves ``kv_sync``: a
snapshot of its whole cache (``{"event_id", "events"}``, events that rebuild it from empty).

A router's `KvIndexer` applies the events of every worker of the component to a
`RadixTree`. When an event id jumps (a message was lost) it stops applying that worker's
events, asks the worker's ``kv_sync`` for a snapshot, rebuilds that worker's part of the
tree, then replays the events that came meanwhile. `prune` drops workers that left.

Example:
    >>> import asyncio
    >>> from dynamo_nb import DistributedRuntime
    >>> async def main():
    ...     async with await DistributedRuntime.create() as rt:
    ...         component = rt.namespace("dynamo").component("backend")
    ...         indexer = await KvIndexer.start(component)             # the router's side
    ...         publisher = KvEventPublisher(component, worker_id=7)   # a worker's side
    ...         await publisher.serve_sync(lambda: [])
    ...         await publisher.stored(None, [{"block_hash": 1, "tokens_hash": 11}])
    ...         await asyncio.sleep(0.01)
    ...         return indexer.tree.find_matches([11]).scores
    >>> asyncio.run(main())
    {7: 1}
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, RequestError
from .indexer import RadixTree

if TYPE_CHECKING:
    from ...runtime.client import Client
    from ...runtime.distributed import Component, DistributedRuntime

__all__ = ["KV_EVENTS_TOPIC", "KV_SYNC_ENDPOINT", "KvEventPublisher", "KvIndexer"]

logger = logging.getLogger("dynamo_nb.kv")

KV_EVENTS_TOPIC = "kv_events"
KV_SYNC_ENDPOINT = "kv_sync"


class KvEventPublisher:
    """Numbers and sends one worker's KV events; serves its snapshot for routers that lost some.

    Hand its `publish` to the engine (``kv_events=``); once the engine exists, `serve_sync` with
    the engine's ``kv_snapshot`` (the events that rebuild its cache from empty).
    """

    def __init__(self, component: Component, worker_id: int) -> None:
        self.component = component
        self.worker_id = worker_id
        self.snapshot: Callable[[], list[Any]] = list
        self.event_id = 0

    async def publish(self, event: Any) -> int:
        """Send one event (``{"stored": …}``, ``{"removed": …}`` or ``"cleared"``); its id."""
        self.event_id += 1
        message = {"worker_id": self.worker_id, "event_id": self.event_id, "event": event}
        await self.component.publish_event(KV_EVENTS_TOPIC, message)
        return self.event_id

    async def stored(self, parent_hash: int | None, blocks: Sequence[dict[str, int]]) -> int:
        return await self.publish({"stored": {"parent_hash": parent_hash, "blocks": list(blocks)}})

    async def removed(self, block_hashes: Sequence[int]) -> int:
        return await self.publish({"removed": {"block_hashes": list(block_hashes)}})

    async def cleared(self) -> int:
        return await self.publish("cleared")

    async def serve_sync(self, snapshot: Callable[[], list[Any]]) -> Any:
        """Serve ``kv_sync`` on this component with ``snapshot()`` (this runtime's instance answers
        for this worker)."""
        self.snapshot = snapshot
        return await self.component.endpoint(KV_SYNC_ENDPOINT).serve(self._sync)

    async def _sync(self, request: Any, context: Any = None) -> Any:
        yield {"worker_id": self.worker_id, "event_id": self.event_id, "events": self.snapshot()}

    @classmethod
    async def for_worker(cls, runtime: DistributedRuntime, component: Component) -> KvEventPublisher | None:
        """The publisher of ``runtime``'s engine on ``component``; None when the runtime's events
        cannot cross processes (no ``nats_url``: logged at info level, since only a KV router
        in front of this worker would miss them).

        Example::

            publisher = await KvEventPublisher.for_worker(runtime, endpoint.component())
            engine = MockerEngine(kv_events=publisher.publish if publisher else None)
            if publisher:
                await publisher.serve_sync(engine.kv_snapshot)
        """
        try:
            await runtime.events()  # NATS, or in-process with memory discovery
        except ConfigError as exc:
            logger.info("KV events off (%s); a KV router in front of this worker needs --no-kv-events", exc)
            return None
        return cls(component, runtime.connection_id)


class KvIndexer:
    """A router's view of every worker's cache, kept from their KV events (see the module docstring).

    Attributes:
        tree: the `RadixTree`.
        gaps_repaired: snapshots fetched after a lost event.
    """

    def __init__(self, component: Component, tree: RadixTree | None = None) -> None:
        """Use `KvIndexer.start`."""
        self.component = component
        self.tree = tree or RadixTree()
        self.gaps_repaired = 0
        self._last: dict[int, int] = {}  # worker → last applied event id
        self._repairing: dict[int, list[dict[str, Any]]] = {}  # worker → events held during a repair
        self._sync: Client | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._unwatch_reconnects: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, component: Component, tree: RadixTree | None = None) -> KvIndexer:
        """Listen to ``component``'s KV events."""
        indexer = cls(component, tree)
        indexer._sync = await component.endpoint(KV_SYNC_ENDPOINT).client()
        indexer._unsubscribe = await component.subscribe_events(KV_EVENTS_TOPIC, indexer._on_message)
        plane = await component.namespace.runtime.events()
        indexer._unwatch_reconnects = plane.on_reconnect(indexer.resync_all)  # events may have been lost
        return indexer

    def resync_all(self) -> None:
        """Re-sync every known worker from its snapshot (after the event plane lost its server)."""
        for worker in list(self._last):
            if worker not in self._repairing:
                self._start_repair(worker, [])

    def _on_message(self, message: dict[str, Any]) -> None:
        worker, event_id = message.get("worker_id"), message.get("event_id")
        if not isinstance(worker, int) or not isinstance(event_id, int) or "event" not in message:
            logger.warning("dropping a malformed KV event message: %r", message)
            return
        held = self._repairing.get(worker)
        if held is not None:
            held.append(message)
            return
        last = self._last.get(worker, 0)
        if event_id <= last:
            return  # already applied (a replay)
        if event_id != last + 1:
            logger.warning("KV events of worker %x jumped from %d to %d: re-syncing", worker, last, event_id)
            self._start_repair(worker, [message])
            return
        self._apply(worker, message)

    def _start_repair(self, worker: int, held: list[dict[str, Any]]) -> None:
        self._repairing[worker] = held
        task = asyncio.get_running_loop().create_task(self._repair(worker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _apply(self, worker: int, message: dict[str, Any]) -> None:
        try:
            self.tree.apply_event(worker, message["event"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("dropping a bad KV event of worker %x: %s", worker, exc)
        self._last[worker] = message["event_id"]

    async def _repair(self, worker: int) -> None:
        """Rebuild ``worker``'s blocks from its snapshot, then replay what came meanwhile."""
        try:
            assert self._sync is not None
            snapshot = None
            for attempt, pause in enumerate((0.5, 1.0, 2.0, None)):  # its request plane may reconnect later
                try:
                    async for item in self._sync.direct({}, worker):
                        snapshot = item
                    break
                except RequestError:
                    if pause is None:
                        raise
                    logger.debug("KV snapshot of worker %x failed (try %d); retrying", worker, attempt + 1)
                    await asyncio.sleep(pause)
            if not isinstance(snapshot, dict):
                raise RequestError(f"worker {worker:x} sent no KV snapshot")
            self.tree.remove_worker(worker)
            for event in snapshot.get("events") or []:
                self.tree.apply_event(worker, event)
            self._last[worker] = int(snapshot["event_id"])
            self.gaps_repaired += 1
        except (RequestError, ValueError, KeyError, TypeError) as exc:
            held = self._repairing.pop(worker, [])
            logger.warning(
                "could not re-sync the KV events of worker %x: %s; dropping its blocks", worker, exc
            )
            self.tree.remove_worker(worker)  # and go on from its latest event (no endless re-sync)
            self._last[worker] = max((m["event_id"] for m in held), default=self._last.get(worker, 0))
            return
        held = self._repairing.pop(worker, [])
        for message in sorted(held, key=lambda m: m["event_id"]):
            self._on_message(message)

    def prune(self, live_workers: set[int]) -> list[int]:
        """Forget workers that are not in ``live_workers`` (they left discovery); which went."""
        gone = [w for w in self.tree.workers() if w not in live_workers]
        for worker in gone:
            self.tree.remove_worker(worker)
            self._last.pop(worker, None)
        return gone

    async def stop(self) -> None:
        """Stop listening (once; later calls do nothing)."""
        if self._unwatch_reconnects is not None:
            self._unwatch_reconnects()
            self._unwatch_reconnects = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for task in list(self._tasks):
            task.cancel()
