"""Admission control: how many requests of a model the frontend lets in, and what waits.

A model's capacity is the sum of its workers' limits (each card's ``max_num_seqs``). While
fewer requests than that are in flight, a request goes straight on. Beyond it, requests wait
in a first-come queue for a slot, at most ``max_queue`` of them (None: no bound) and at most
``queue_timeout`` seconds each; a request that finds the queue full, or waits too long, gets
`OverloadedError` at once: a 503 with ``Retry-After`` and OpenAI's error body, whose message
names the limit hit (its ``reason``), the value measured and the threshold. A model whose
workers publish no limit is not bounded here (its engines queue).

Example:
    >>> import asyncio
    >>> async def main():
    ...     admission = Admission(max_queue=0)
    ...     await admission.enter(capacity=1)
    ...     try:
    ...         await admission.enter(capacity=1)
    ...     except OverloadedError as exc:
    ...         return exc.http_status, exc.reason, exc.measured, exc.threshold
    >>> asyncio.run(main())
    (503, 'queue_full', 0, 0)
"""

from __future__ import annotations

import asyncio
import collections

from ..errors import OverloadedError

__all__ = ["DEFAULT_QUEUE_TIMEOUT", "Admission"]

DEFAULT_QUEUE_TIMEOUT = 60.0


class Admission:
    """One model's requests in flight at the frontend, and its queue (see the module docstring).

    Attributes:
        inflight: requests let in and not yet finished.
        waiting: requests in the queue now.
    """

    def __init__(
        self, max_queue: int | None = None, queue_timeout: float = DEFAULT_QUEUE_TIMEOUT, model: str = ""
    ) -> None:
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.model = model
        self.inflight = 0
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def enter(self, capacity: int | None) -> None:
        """Let one request in (now, or once a slot frees); `OverloadedError` when it cannot be.

        ``capacity``: the model's limit on requests in flight now (None: none)."""
        if capacity is None or (self.inflight < capacity and not self._queue):
            self.inflight += 1
            return
        if self.max_queue is not None and len(self._queue) >= self.max_queue:
            raise OverloadedError(
                f"{self._name()} is overloaded: its workers are full ({self.inflight} requests in flight, "
                f"capacity {capacity}) and so is the queue: {len(self._queue)} requests wait, the limit is "
                f"{self.max_queue} (the frontend's --max-queue). Retry later, or add workers",
                reason="queue_full",
                measured=len(self._queue),
                threshold=self.max_queue,
            )
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        self._queue.append(turn)
        queued_at = loop.time()
        try:
            await asyncio.wait_for(turn, self.queue_timeout)
        except asyncio.TimeoutError:
            waited = loop.time() - queued_at
            raise OverloadedError(
                f"{self._name()} is overloaded: its workers stayed full ({self.inflight} requests in flight, "
                f"capacity {capacity}) while this request waited {waited:.1f} s for a slot; the limit is "
                f"{self.queue_timeout:g} s (the frontend's --queue-timeout). Retry later, or add workers",
                reason="queue_timeout",
                measured=round(waited, 3),
                threshold=self.queue_timeout,
            ) from None
        except BaseException:
            if turn.done() and not turn.cancelled():  # the slot was handed to us: pass it on
                self.inflight += 1
                self.leave()
            raise
        finally:
            if turn in self._queue:
                self._queue.remove(turn)
        self.inflight += 1

    def _name(self) -> str:
        return f"model {self.model!r}" if self.model else "the model"

    def leave(self) -> None:
        """A request let in has finished: its slot goes to the first request waiting."""
        self.inflight -= 1
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
