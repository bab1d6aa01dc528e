"""KV routers that share their decisions, so N frontend processes route as well as one.

Each KV router counts the load of the requests it routed (`ActiveLoad`) and, until the worker's
KV events confirm them, the prompts it sent where (a pending entry in its `RadixTree`). With
several frontend processes (``--http-workers N``, or frontend replicas) each router would see
only its own share. `ReplicaSync` sends a router's decisions to the others over the event plane,
as Dynamo's ``--router-replica-sync`` does: on the routed component's ``router_sync_<endpoint>``
topic, a message ``{"router": ID, "ops": [...]}`` carries, in order, what happened since the
last one:

- ``{"op": "add", "request", "worker", "new_tokens", "hashes", "sequence"}``: a request was
  routed (its load, and its prompt's blocks as pending on that worker);
- ``{"op": "prefill_done", "request", "worker"}``: its first token came back;
- ``{"op": "free", "request", "worker"}``: it ended.

The other routers apply them to their own loads and tree, and ignore their own messages.
A router sends an empty message every ``heartbeat`` seconds when it has nothing else to say,
and ``{"router": ID, "bye": true}`` when it stops; the requests of a router not heard from for
``silence`` seconds are dropped (its process died), and so is a remote request older than
``max_age`` (its ``free`` was lost: the event plane delivers at most once).

Example::

    router = await KvRouter.create(client, 16, KvRouterConfig(replica_sync=True), component=component)
    router.sync.peers          # the other routers heard from
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .selector import ActiveLoad

if TYPE_CHECKING:
    from ...runtime.distributed import Component
    from .router import KvRouter

__all__ = ["SYNC_TOPIC_PREFIX", "ReplicaSync"]

logger = logging.getLogger("dynamo_nb.kv")

SYNC_TOPIC_PREFIX = "router_sync_"


class ReplicaSync:
    """Sends one `KvRouter`'s decisions to its replicas and applies theirs (see the module docstring).

    Attributes:
        router_id: this router's id in the messages (random, 63 bits).
        peers: the other routers heard from, with when (``time.monotonic()``).
        applied: operations of other routers applied here.
        sent: operations sent.
    """

    def __init__(
        self,
        component: Component,
        router: KvRouter,
        topic: str,
        *,
        heartbeat: float = 2.0,
        silence: float = 10.0,
        max_age: float = 1800.0,
    ) -> None:
        """Use `ReplicaSync.start`."""
        self.component = component
        self.router = router
        self.topic = topic
        self.heartbeat = heartbeat
        self.silence = silence
        self.max_age = max_age
        self.router_id = random.getrandbits(63)
        self.peers: dict[int, float] = {}
        self.applied = 0
        self.sent = 0
        self._remote: dict[int, dict[str, tuple[int, float]]] = {}  # router → request → (worker, when)
        self._outbox: list[dict[str, Any]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._last_sent = 0.0
        self._beat: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    @classmethod
    async def start(
        cls, component: Component, router: KvRouter, endpoint_name: str, **timing: float
    ) -> ReplicaSync:
        """Share ``router``'s decisions for ``component``'s endpoint ``endpoint_name`` with the other
        routers of that endpoint (``timing``: ``heartbeat``, ``silence``, ``max_age`` in seconds)."""
        sync = cls(component, router, SYNC_TOPIC_PREFIX + endpoint_name, **timing)
        sync._unsubscribe = await component.subscribe_events(sync.topic, sync._on_message)
        sync._beat = asyncio.get_running_loop().create_task(sync._heartbeat())
        return sync

    # --- what this router did -------------------------------------------------------------------

    def added(
        self, request_id: str, worker: int, new_tokens: int, hashes: list[int], sequence: list[int]
    ) -> None:
        """This router routed ``request_id`` to ``worker``."""
        self._send(
            {
                "op": "add",
                "request": request_id,
                "worker": worker,
                "new_tokens": new_tokens,
                "hashes": hashes,
                "sequence": sequence,
            }
        )

    def prefill_done(self, request_id: str, worker: int) -> None:
        """The first token of ``request_id`` came back."""
        self._send({"op": "prefill_done", "request": request_id, "worker": worker})

    def freed(self, request_id: str, worker: int) -> None:
        """``request_id`` ended."""
        self._send({"op": "free", "request": request_id, "worker": worker})

    def _send(self, op: dict[str, Any]) -> None:
        self._outbox.append(op)
        if self._flushing is None:  # the operations of this loop turn go out in one message
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:  # one sender at a time, so the others see each request's operations in order
            while self._outbox:
                ops, self._outbox = self._outbox, []
                await self._publish({"router": self.router_id, "ops": ops})
                self.sent += len(ops)
        finally:
            self._flushing = None

    async def _publish(self, message: dict[str, Any]) -> None:
        self._last_sent = time.monotonic()
        try:
            await self.component.publish_event(self.topic, message)
        except Exception as exc:  # the event plane may be reconnecting; routing goes on
            logger.warning("router sync: could not publish (%s); the other routers miss it", exc)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            if time.monotonic() - self._last_sent >= self.heartbeat:
                await self._publish({"router": self.router_id, "ops": []})
            self.sweep()

    # --- what the other routers did -------------------------------------------------------------

    def _on_message(self, message: dict[str, Any]) -> None:
        sender = message.get("router")
        if not isinstance(sender, int) or sender == self.router_id:
            return
        if message.get("bye") is True:
            self._forget(sender)
            return
        ops = message.get("ops")
        if not isinstance(ops, list):
            logger.warning("router sync: dropping a malformed message from router %x", sender)
            return
        now = time.monotonic()
        self.peers[sender] = now
        requests = self._remote.setdefault(sender, {})
        for op in ops:
            try:
                self._apply(requests, op, now)
            except (TypeError, ValueError, KeyError) as exc:
                logger.warning("router sync: dropping a bad operation from router %x: %s", sender, exc)

    def _apply(self, requests: dict[str, tuple[int, float]], op: dict[str, Any], now: float) -> None:
        kind, request_id, worker = op["op"], op["request"], op["worker"]
        if not isinstance(request_id, str) or not isinstance(worker, int):
            raise TypeError(f"request {request_id!r} and worker {worker!r} must be a string and an int")
        router = self.router
        if kind == "add":
            if request_id in requests:
                return  # a duplicate
            new_tokens, hashes, sequence = int(op["new_tokens"]), op["hashes"], op["sequence"]
            if not all(isinstance(h, int) for h in (*hashes, *sequence)) or len(hashes) != len(sequence):
                raise TypeError("hashes and sequence must be lists of ints of one length")
            router.loads.setdefault(worker, ActiveLoad()).add(request_id, new_tokens, sequence)
            ttl = router.config.pending_ttl if router.follows_events else router.config.approx_ttl
            router.tree.insert(worker, hashes, ttl, block_ids=sequence)
            requests[request_id] = (worker, now)
        elif kind == "prefill_done":
            if request_id in requests:
                router.loads[worker].prefill_done(request_id)
        elif kind == "free":
            if requests.pop(request_id, None) is not None:
                router.loads[worker].free(request_id)
        else:
            raise ValueError(f"unknown operation {kind!r}")
        self.applied += 1

    def _forget(self, sender: int) -> None:
        """Drop the requests of router ``sender`` (it stopped or went silent)."""
        self.peers.pop(sender, None)
        for request_id, (worker, _) in self._remote.pop(sender, {}).items():
            self._free(request_id, worker)

    def _free(self, request_id: str, worker: int) -> None:
        load = self.router.loads.get(worker)
        if load is not None:
            load.free(request_id)

    def sweep(self) -> None:
        """Drop routers silent for ``silence`` s and remote requests older than ``max_age`` s."""
        now = time.monotonic()
        for sender, heard in list(self.peers.items()):
            if now - heard > self.silence:
                logger.info("router sync: router %x went silent; dropping its %d requests", sender,
                            len(self._remote.get(sender, {})))  # fmt: skip
                self._forget(sender)
        for requests in self._remote.values():
            for request_id, (worker, when) in list(requests.items()):
                if now - when > self.max_age:
                    del requests[request_id]
                    self._free(request_id, worker)

    async def stop(self) -> None:
        """Stop listening and tell the others this router's requests are gone (once)."""
        if self._unsubscribe is None:
            return
        self._unsubscribe()
        self._unsubscribe = None
        if self._beat is not None:
            self._beat.cancel()
        if self._flushing is not None:
            await self._flushing
        await self._publish({"router": self.router_id, "bye": True})
