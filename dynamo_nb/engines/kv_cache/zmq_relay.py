"""Relay an engine's own KV events (vLLM's ZMQ publisher) to our KV router.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``)
publishes each scheduler step's cache changes on a ZMQ PUB socket as msgpack frames
``[topic, seq, EventBatch]``; an ``EventBatch`` is ``[ts, events, dp_rank]`` and each event a
map tagged by ``type``: ``BlockStored`` (engine block hashes, parent hash, the blocks' token
ids), ``BlockRemoved`` (hashes) or ``AllBlocksCleared``. SGLang's publisher uses the same shapes.

`ZmqKvRelay` subscribes to that socket and turns each event into ours (`dynamo_nb.router.kv`):
``stored``, ``removed``, ``cleared``, in our block ids: ``tokens_hash`` is our hash of the
block's token ids and ``block_hash`` our sequence hash (the block with its prefix), the ids the
router gives a prompt it routes. So the router matches requests by content, and a stored event
confirms the very blocks the router counted as pending on that worker. The engine's own ids are
mapped (a removal names them). It keeps the live blocks, so `ZmqKvRelay.snapshot` rebuilds a
router's view after a lost event.

Example:
    >>> from dynamo_nb.router.kv.hashing import block_hashes, sequence_hashes
    >>> relay = ZmqKvRelay("tcp://127.0.0.1:5557", block_size=2)
    >>> stored = relay.translate({"type": "BlockStored", "block_hashes": [b"\\x01" * 8],
    ...                           "parent_block_hash": None, "token_ids": [5, 6], "block_size": 2})
    >>> stored["stored"]["blocks"][0]["block_hash"] == sequence_hashes(block_hashes([5, 6], 2))[0]
    True
    >>> relay.translate({"type": "AllBlocksCleared"}), relay.snapshot()
    ('cleared', [])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from typing import Any

from ...router.kv.hashing import block_hashes, sequence_hashes
from ...runtime.bounded_decode import unpack_bounded
from ...runtime.planes.wire import MAX_FRAME_BYTES
from ..base import KvEvent, KvEventSink
from .blocks import publish_kv_events

__all__ = ["RelayedKvEvents", "ZmqKvRelay", "engine_block_id"]

logger = logging.getLogger("dynamo_nb.engines.kv_events")


def engine_block_id(value: int | bytes) -> int:
    """An engine's block hash as our block id: ints as they are (negative ones as u64), bytes as
    their first 8 bytes, little-endian.

    Example:
        >>> engine_block_id(-1), engine_block_id(b"\\x02" + b"\\x00" * 31)
        (18446744073709551615, 2)
    """
    if isinstance(value, (bytes, bytearray)):
        return int.from_bytes(bytes(value[:8]), "little")
    return int(value) & 0xFFFF_FFFF_FFFF_FFFF


class ZmqKvRelay:
    """Subscribes to an engine's ZMQ KV-event publisher at ``endpoint`` and sends our events to a sink.

    With ``bind`` the relay's socket binds ``endpoint`` (say ``tcp://127.0.0.1:PORT``) and the
    engine's publisher connects to it; else the publisher binds and the relay connects.

    Attributes:
        events_relayed: events sent on; ``events_dropped``: frames that could not be read.
    """

    def __init__(self, endpoint: str, block_size: int, *, topic: str = "", bind: bool = False) -> None:
        self.endpoint = endpoint
        self.bind = bind
        self.block_size = block_size
        self.topic = topic
        self.events_relayed = 0
        self.events_dropped = 0
        # our block id → (its parent's, its tokens' hash)
        self._blocks: OrderedDict[int, tuple[int | None, int]] = OrderedDict()
        self._ours: dict[int, int] = {}  # the engine's block id → ours
        self._holders: Counter[int] = Counter()  # our id → engine blocks mapped to it
        self._task: asyncio.Task[None] | None = None
        self._socket: Any = None
        #: stored events also carry their blocks' ``token_ids`` (for a sink that hashes them
        #: itself, NVIDIA Dynamo's publisher: ``wants_token_ids``)
        self.event_token_ids = False

    async def start(self, sink: KvEventSink) -> None:
        """Connect and relay in the background until `stop`."""
        self.event_token_ids = bool(getattr(sink, "wants_token_ids", False))
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        self._socket = context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # a longer one drops the peer unread
        self._socket.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        if self.bind:  # the engine's publisher connects to us (vLLM connects to an address without "*")
            self._socket.bind(self.endpoint)
        else:
            self._socket.connect(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(self._run(sink), name="dynamo_nb-kv-relay")

    async def _run(self, sink: KvEventSink) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            try:
                batch = unpack_bounded(frames[-1], strict_map_key=False)
                events = [self.translate(event) for event in batch[1]]
            except Exception:  # a frame we cannot read: the router re-syncs from the snapshot
                self.events_dropped += 1
                logger.warning("unreadable KV event frame from %s", self.endpoint, exc_info=True)
                continue
            self.events_relayed += await publish_kv_events(sink, [e for e in events if e is not None])

    def translate(self, event: dict[str, Any]) -> KvEvent | None:
        """Our event for one engine event (None for one we do not follow), and the live blocks updated."""
        kind = event.get("type")
        if kind == "BlockStored":
            size = event.get("block_size") or self.block_size
            content = block_hashes(event["token_ids"], size)
            engine_ids = [engine_block_id(h) for h in event["block_hashes"]][: len(content)]
            parent = event.get("parent_block_hash")
            if parent is None:
                first_parent = None
            else:  # a parent never relayed (the relay started late) keeps the engine's id: a gap
                first_parent = self._ours.get(engine_block_id(parent), engine_block_id(parent))
            ids = sequence_hashes(content[: len(engine_ids)], parent=first_parent)
            blocks = []
            parent_id = first_parent
            for engine_id, block_id, tokens_hash in zip(engine_ids, ids, content, strict=False):
                before = self._ours.get(engine_id)
                if before != block_id:  # new (or the engine reused its id for other content)
                    if before is not None:
                        self._release(before)
                    self._ours[engine_id] = block_id
                    self._holders[block_id] += 1
                self._blocks[block_id] = (parent_id, tokens_hash)
                blocks.append({"block_hash": block_id, "tokens_hash": tokens_hash})
                parent_id = block_id
            stored: dict[str, Any] = {"parent_hash": first_parent, "blocks": blocks}
            if self.event_token_ids:
                stored["token_ids"] = list(event["token_ids"][: len(blocks) * size])
            return {"stored": stored}
        if kind == "BlockRemoved":
            gone = [
                self._ours.pop(engine_id, engine_id)
                for engine_id in map(engine_block_id, event["block_hashes"])
            ]
            return {"removed": {"block_hashes": [block_id for block_id in gone if self._release(block_id)]}}
        if kind == "AllBlocksCleared":
            self._blocks.clear()
            self._ours.clear()
            self._holders.clear()
            return "cleared"
        return None

    def _release(self, block_id: int) -> bool:
        """One engine block of ours ``block_id`` went; True when none is left (the block is gone)."""
        self._holders[block_id] -= 1
        if self._holders[block_id] > 0:  # another engine block holds the same content
            return False
        del self._holders[block_id]
        self._blocks.pop(block_id, None)
        return True

    def snapshot(self) -> list[KvEvent]:
        """Events that rebuild the engine's cache as relayed so far (parents before children)."""
        return [
            {"stored": {"parent_hash": parent, "blocks": [{"block_hash": block_id, "tokens_hash": content}]}}
            for block_id, (parent, content) in self._blocks.items()
        ]

    async def stop(self) -> None:
        """Stop relaying and close the socket."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close(linger=0)


class RelayedKvEvents:
    """Mixin of an engine whose KV events come through a `ZmqKvRelay` (vLLM, SGLang): its
    ``kv_snapshot`` and relayed-event count; ``relay`` is None when no sink was given."""

    relay: ZmqKvRelay | None = None

    def kv_snapshot(self) -> list[KvEvent]:
        """Events that rebuild the engine's prefix cache as relayed so far ([] without KV events)."""
        return self.relay.snapshot() if self.relay is not None else []

    @property
    def kv_events_relayed(self) -> int:
        """KV events sent on to the sink so far."""
        return self.relay.events_relayed if self.relay is not None else 0

    async def stop_relay(self) -> None:
        """Stop relaying (the engine's ``close`` calls it)."""
        if self.relay is not None:
            await self.relay.stop()
