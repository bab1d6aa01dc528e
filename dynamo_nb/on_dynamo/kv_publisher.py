"""An engine's KV events to NVIDIA Dynamo's KV router: `DynamoKvEvents` is the engine's
KV-event sink on ``--runtime dynamo``, publishing with Dynamo's ``KvEventPublisher``.

Dynamo's publisher hashes each stored block's tokens itself (its router matches prompts by
those hashes), so the engine's block manager adds the blocks' ``token_ids`` to its ``stored``
events for this sink (``wants_token_ids``); the kit's sequence hashes are the block ids
(Dynamo's ``block_hashes``, signed 64-bit), so a ``removed`` event names the same blocks.

Example::

    sink = DynamoKvEvents(endpoint)                       # a DynamoEndpoint
    engine = MockerEngine(kv_events=sink, block_size=16)
    # python -m dynamo.frontend --router-mode kv routes by what the engine holds
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runtime import DynamoEndpoint

__all__ = ["DynamoKvEvents", "signed64"]

logger = logging.getLogger(__name__)


def signed64(value: int) -> int:
    """A 64-bit hash as the signed integer Dynamo's publisher takes.

    Example:
        >>> signed64(2**64 - 1), signed64(5)
        (-1, 5)
    """
    return value - 2**64 if value >= 2**63 else value


class DynamoKvEvents:
    """The engine's KV-event sink (``await sink(event)``) on Dynamo's runtime. `start` creates
    Dynamo's publisher once the engine's block size is known, before the worker serves: Dynamo's
    event plane is ZMQ publish/subscribe, where what is sent before a router has subscribed is
    lost, so a publisher created at the first event would lose that event.

    A sink made with ``enabled=False`` publishes nothing and creates no publisher (Dynamo's ZMQ
    publisher listens on every interface: see `dynamo_nb.on_dynamo.DynamoPlanes.kv_events_allowed`).

    Attributes:
        stored_blocks: blocks announced as stored.
        removed_blocks: blocks announced as removed.
    """

    wants_token_ids = True  # the engine's stored events carry their blocks' tokens

    def __init__(self, endpoint: DynamoEndpoint, *, enabled: bool = True) -> None:
        self.endpoint = endpoint
        self.enabled = enabled
        self.publisher: Any = None
        self.stored_blocks = 0
        self.removed_blocks = 0

    async def __call__(self, event: Any) -> None:
        if not self.enabled:
            return
        if isinstance(event, dict) and "stored" in event:
            self._stored(event["stored"])
        elif isinstance(event, dict) and "removed" in event:
            hashes = [signed64(h) for h in event["removed"]["block_hashes"]]
            if self.publisher is not None and hashes:
                self.publisher.publish_removed(hashes)
                self.removed_blocks += len(hashes)
        elif event == "cleared":  # Dynamo's publisher has no "cleared": its router ages them out
            logger.info("the engine cleared its KV cache; Dynamo's router is not told")

    def start(self, block_size: int) -> None:
        """Create Dynamo's ``KvEventPublisher`` for blocks of ``block_size`` tokens (once)."""
        if self.publisher is None and self.enabled:
            from dynamo.llm import KvEventPublisher

            self.publisher = KvEventPublisher(self.endpoint.inner, kv_block_size=int(block_size))

    def _stored(self, stored: dict[str, Any]) -> None:
        blocks, token_ids = stored["blocks"], stored.get("token_ids")
        if not blocks or not token_ids:
            return
        block_size = len(token_ids) // len(blocks)
        self.start(block_size)  # started by the worker already, unless the engine declared no size
        parent = stored.get("parent_hash")
        self.publisher.publish_stored(
            list(token_ids),
            [block_size] * len(blocks),
            [signed64(block["block_hash"]) for block in blocks],
            parent_hash=None if parent is None else signed64(parent),
        )
        self.stored_blocks += len(blocks)

    def close(self) -> None:
        """Stop the publisher's background task."""
        if self.publisher is not None:
            self.publisher.shutdown()
