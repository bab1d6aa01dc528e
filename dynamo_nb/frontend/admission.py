"""Admission control: how many requests of a model the frontend lets in, and what waits.

A model's capacity is the sum of its workers' limits (each card's ``max_num_seqs``). While
fewer requests than that are in flight, a request goes straight on. Beyond it, requests wait
in a first-come queue for a slot, at most ``max_queue`` of them (None: no bound) and at most
``queue_timeout`` seconds each; a request that finds the queue full, or waits too long, gets
`OverloadedError` at once: a 503 with ``Retry-After`` and OpenAI's error body. A model whose
workers publish no limit is not bounded here (its engines queue).

Example:
    >>> import asyncio
    >>> async def main():
    ...     admission = Admission(max_queue=0)
    ...     await admission.enter(capacity=1)
    ...     try:
    ...         await admission.enter(capacity=1)
    ...     except OverloadedError as exc:
    ...         return exc.http_status, exc.retry_after
    >>> asyncio.run(main())
    (503, 1)
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

    def __init__(self, max_queue: int | None = None, queue_timeout: float = DEFAULT_QUEUE_TIMEOUT) -> None:
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
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
                f"the model's workers are full ({self.inflight} requests in flight, capacity {capacity}) and "
                f"{len(self._queue)} requests wait (the frontend's --max-queue): retry later"
            )
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        try:
            await asyncio.wait_for(turn, self.queue_timeout)
        except asyncio.TimeoutError:
            raise OverloadedError(
                f"no slot freed within {self.queue_timeout:g} s ({self.inflight} requests in flight): retry later"
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

    def leave(self) -> None:
        """A request let in has finished: its slot goes to the first request waiting."""
        self.inflight -= 1
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
