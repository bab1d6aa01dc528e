"""Admission control: how many requests of a model the frontend lets in, and what waits.

A model's capacity is the sum of its workers' limits (each card's ``max_num_seqs``). While
fewer requests than that are in flight, a request goes straight on. Beyond it, requests wait
for a slot, at most ``max_queue`` of them (None: no bound) and at most ``queue_timeout``
seconds each, in Dynamo 1.7's priority order: a higher ``strict_priority`` tier always goes
first; within a tier, the earliest due time, where a request is due when it arrived less
``priority`` × ``priority_seconds`` (1 s by default), so a soft priority moves a request ahead
of those that came less than that long before it, and one that has waited longer goes first
(no starvation; all at priority 0 is first come, first served); a request that finds the queue full, or waits too long, gets
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
import heapq
import itertools

from ..errors import OverloadedError

__all__ = ["DEFAULT_PRIORITY_SECONDS", "DEFAULT_QUEUE_TIMEOUT", "Admission"]

DEFAULT_QUEUE_TIMEOUT = 60.0
DEFAULT_PRIORITY_SECONDS = 1.0


class Admission:
    """One model's requests in flight at the frontend, and its queue (see the module docstring).

    Attributes:
        inflight: requests let in and not yet finished.
        waiting: requests in the queue now.
    """

    def __init__(
        self,
        max_queue: int | None = None,
        queue_timeout: float = DEFAULT_QUEUE_TIMEOUT,
        model: str = "",
        priority_seconds: float = DEFAULT_PRIORITY_SECONDS,
    ) -> None:
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.model = model
        self.priority_seconds = priority_seconds
        self.inflight = 0
        # (-tier, due time, arrival order, turn); a turn given up stays until it surfaces
        self._queue: list[tuple[int, float, int, asyncio.Future[None]]] = []
        self._waiting = 0
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return self._waiting

    async def enter(self, capacity: int | None, *, priority: float = 0.0, strict_priority: int = 0) -> float:
        """Let one request in (now, or once a slot frees, in priority order); `OverloadedError`
        when it cannot be. Returns the seconds it waited.

        ``capacity``: the model's limit on requests in flight now (None: none)."""
        if capacity is None or (self.inflight < capacity and not self._waiting):
            self.inflight += 1
            return 0.0
        if self.max_queue is not None and self._waiting >= self.max_queue:
            raise OverloadedError(
                f"{self._name()} is overloaded: its workers are full ({self.inflight} requests in flight, "
                f"capacity {capacity}) and so is the queue: {self._waiting} requests wait, the limit is "
                f"{self.max_queue} (the frontend's --max-queue). Retry later, or add workers",
                reason="queue_full",
                measured=self._waiting,
                threshold=self.max_queue,
            )
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        queued_at = loop.time()
        due = queued_at - priority * self.priority_seconds
        heapq.heappush(self._queue, (-strict_priority, due, next(self._arrivals), turn))
        self._waiting += 1
        try:
            await asyncio.wait_for(turn, self.queue_timeout)
        except asyncio.TimeoutError:
            if turn.done() and not turn.cancelled():  # handed over as the time ran out (3.12+): ours
                return loop.time() - queued_at
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
                self.leave()
            raise
        finally:
            if not turn.done() or turn.cancelled():  # given up: no longer waiting
                self._waiting -= 1
                if not turn.done():
                    turn.cancel()
                self._compact()
        return loop.time() - queued_at  # the slot came with the turn: inflight already counts it

    def _compact(self) -> None:
        """Drop the turns given up once they are most of the heap."""
        if len(self._queue) > 2 * self._waiting + 64:
            self._queue = [entry for entry in self._queue if not entry[3].done()]
            heapq.heapify(self._queue)

    def _name(self) -> str:
        return f"model {self.model!r}" if self.model else "the model"

    def leave(self) -> None:
        """A request let in has finished: its slot goes to the first request waiting (the
        highest tier, then the earliest due), still counted in flight, so no request that comes
        meanwhile can take it too."""
        while self._queue:
            turn = heapq.heappop(self._queue)[3]
            if not turn.done():
                turn.set_result(None)
                self._waiting -= 1
                return
        self.inflight -= 1
