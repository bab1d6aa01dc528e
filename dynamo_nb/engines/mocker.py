"""The ``mocker`` engine: a simulated LLM engine for routing experiments at scale, no GPU, no model.

A vLLM-style loop: each step admits waiting requests while the token budget
(``max_num_batched_tokens``), ``max_num_seqs`` and the KV pool allow, prefills them (their
uncached prompt tokens) and gives every running request one token. A step lasts what
Dynamo's published timing model says (milliseconds, divided by ``speedup_ratio``):

- prefill: ``4.209989e-7·T² + 1.518344e-2·T + 16.50142`` for T uncached prompt tokens in the
  step (0 when everything was cached);
- decode: ``-25.74·p² + 54.01·p + 5.74`` (at least 1) with p = active KV tokens / total KV tokens.

Its KV block manager reuses cached prompt prefixes and emits real KV events (``publish``),
so the KV router sees what it would see from vLLM. It streams exactly ``max_tokens`` tokens
(the prompt's ids, cycled), ignoring eos.

Example:
    >>> engine = MockerEngine(block_size=16, speedup_ratio=10.0)            # doctest: +SKIP
    >>> await endpoint.serve(engine.generate)                                # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .._context import Context
from ..llm.protocol import PreprocessedRequest
from ._base import final_item
from .mocker_kv import Allocation, MockKvManager

__all__ = ["MockerEngine", "decode_ms", "prefill_ms"]


def prefill_ms(uncached_tokens: int) -> float:
    """Dynamo's polynomial prefill time for ``uncached_tokens`` new prompt tokens in a step."""
    if uncached_tokens <= 0:
        return 0.0
    t = float(uncached_tokens)
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def decode_ms(kv_load: float) -> float:
    """Dynamo's polynomial decode step time at ``kv_load`` = active KV tokens / total (floor 1 ms)."""
    return max(-25.74 * kv_load * kv_load + 54.01 * kv_load + 5.74, 1.0)


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    allocation: Allocation | None = None
    generated: int = 0
    cancelled: bool = False


class MockerEngine:
    """See the module docstring.

    Attributes:
        kv: the `MockKvManager`.
        prefix_hits, prompt_blocks: cached and total prompt blocks of admitted requests.
        steps: engine steps run.
    """

    def __init__(
        self,
        *,
        block_size: int = 16,
        num_blocks: int = 16384,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        speedup_ratio: float = 1.0,
        publish: Callable[[Any], Awaitable[Any]] | None = None,
    ) -> None:
        if speedup_ratio <= 0:
            raise ValueError(f"speedup_ratio must be positive, got {speedup_ratio}")
        self.kv = MockKvManager(num_blocks, block_size)
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.speedup_ratio = speedup_ratio
        self.publish = publish
        self.prefix_hits = 0
        self.prompt_blocks = 0
        self.steps = 0
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        """Requests running or waiting."""
        return len(self._running) + len(self._waiting)

    async def generate(
        self, request: dict[str, Any], context: Context | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The engine's handler: exactly ``max_tokens`` tokens (default 16), the last with usage."""
        parsed = PreprocessedRequest.from_dict(request)
        max_tokens = parsed.stop_conditions.max_tokens or 16
        job = _Request(parsed.token_ids, max_tokens)
        self._waiting.append(job)
        self._ensure_loop()
        try:
            while True:
                token = await job.queue.get()
                job.generated += 1
                if job.generated >= job.max_tokens:
                    yield final_item([token], "length", len(job.prompt), job.generated)
                    return
                yield {"token_ids": [token]}
                if context is not None and context.is_stopped():
                    yield final_item([], "cancelled", len(job.prompt), job.generated)
                    return
        finally:
            job.cancelled = True
            with contextlib.suppress(ValueError):
                self._waiting.remove(job)

    def _ensure_loop(self) -> None:
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="dynamo_nb-mocker")

    async def _run(self) -> None:
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            new_tokens = self._admit()
            load = self.kv.active_blocks / self.kv.num_blocks
            step_ms = prefill_ms(new_tokens) + (decode_ms(load) if self._running else 0.0)
            await self._publish_events()
            await asyncio.sleep(step_ms / 1000.0 / self.speedup_ratio)
            self.steps += 1
            self._emit()

    def _admit(self) -> int:
        """Move waiting requests to running while budget and KV allow; their uncached prompt tokens."""
        budget = self.max_num_batched_tokens - len(self._running)
        uncached_total = 0
        while self._waiting and len(self._running) < self.max_num_seqs:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                continue
            if not self.kv.can_allocate(job.prompt):
                break
            job.allocation = self.kv.allocate(job.prompt)
            uncached = max(len(job.prompt) - job.allocation.cached_blocks * self.block_size, 0)
            if uncached > budget and self._running:  # too big for this step; a step of its own later
                self.kv.release(job.allocation)
                job.allocation = None
                break
            self._waiting.popleft()
            self._running.append(job)
            budget -= uncached
            uncached_total += uncached
            self.prefix_hits += job.allocation.cached_blocks
            self.prompt_blocks += len(job.allocation.sequence)
        return uncached_total

    def _emit(self) -> None:
        """One token for every running request; finished and cancelled ones leave and free their blocks."""
        still = []
        for job in self._running:
            done = job.cancelled or job.queue.qsize() + job.generated >= job.max_tokens
            if not done:
                job.queue.put_nowait(job.prompt[(job.generated + job.queue.qsize()) % len(job.prompt)])
                done = job.queue.qsize() + job.generated >= job.max_tokens
            if done:
                if job.allocation is not None:
                    self.kv.release(job.allocation)
                    job.allocation = None
            else:
                still.append(job)
        self._running = still

    async def _publish_events(self) -> None:
        events = self.kv.drain_events()
        if self.publish is not None:
            for event in events:
                await self.publish(event)

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    def __repr__(self) -> str:
        return f"<MockerEngine block_size={self.block_size} {self.active} active, {self.kv.used_blocks} blocks cached>"
