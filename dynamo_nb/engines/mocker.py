"""The ``mocker`` engine: a simulated LLM engine for routing experiments at scale, no GPU, no model.

A vLLM-style loop with chunked prefill: each step gives every prefilled request one decode
token, spends the rest of the token budget (``max_num_batched_tokens``) on prompt chunks of
running prefills, then admits waiting requests (while ``max_num_seqs`` and the KV pool allow)
with chunks of their uncached prompt tokens. A request's first token comes at the end of the
step that finishes its prompt. A step lasts what Dynamo's mocker says (its polynomial
timing model, milliseconds):

- prefill: ``4.209989e-7·T² + 1.518344e-2·T + 16.50142`` for T uncached prompt tokens in the
  step (0 when everything was cached), divided by ``speedup_ratio``;
- decode, when some request has a token to emit at the end of the step (including those whose
  prompt the step finishes; a prefill worker's handoffs do not count):
  ``max(-25.74·p² + 54.01·p + 5.74, 1)`` with p = KV tokens held by running requests (their
  prompts and the tokens decoded so far, in whole blocks) / total KV tokens, divided by
  ``speedup_ratio · decode_speedup_ratio``.

Steps run against an absolute clock: each step's deadline is the previous one plus its
duration, so the event loop's timer resolution (about 1 ms) and the scheduler's own work are
carried over, not added to every step; simulated time matches the model over many steps.

Its KV block manager reuses cached prompt prefixes and emits real KV events (``kv_events``),
so the KV router sees what it would see from vLLM. It streams exactly ``max_tokens`` tokens
(the prompt's ids, cycled, leaving out ``skip_token_ids``: the mocker worker passes the
tokenizer's special tokens, which decode to no text), ignoring eos.

Disaggregated roles, like the ``hf`` engine's: `prefill` computes the prompt (one token) and
parks a tensor-less handoff (``prompt_tokens``, ``first_token``) in its bootstrap server;
`decode` fetches it, takes KV blocks for the whole prompt as computed (they arrived; the
transfer itself takes no simulated time) and decodes from the second token on.

Example:
    >>> import asyncio
    >>> from dynamo_nb.llm import PreprocessedRequest, StopConditions
    >>> async def run():
    ...     engine = MockerEngine(block_size=4, speedup_ratio=1000.0)
    ...     request = PreprocessedRequest(list(range(8)), StopConditions(max_tokens=3))
    ...     outputs = [output async for output in engine.generate(request)]
    ...     await engine.close()
    ...     return [o.token_ids for o in outputs], outputs[-1].finish_reason, engine.stats()["cached_blocks"]
    >>> asyncio.run(run())
    ([[0], [1], [2]], 'length', 2)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disagg.decode import fetch_prompt_kv
from ..disagg.prefill import BootstrapRole
from ..errors import ConfigError, DisaggregationError, InvalidRequestError
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from .base import KvEvent, KvEventSink, token_budget
from .kv_cache.blocks import Allocation, KvBlockManager, publish_kv_events

__all__ = ["MOCK_KV_FORMAT", "MockerEngine", "decode_ms", "prefill_ms"]

MOCK_KV_FORMAT = "dynamo_nb.mock-kv.v1"  # a prefill's handoff: no tensors, the prompt length and first token

# The timing model follows Dynamo's mocker: ai-dynamo/dynamo lib/mocker/src/common/perf_model.rs
# (PerfModel::Polynomial) and lib/mocker/src/scheduler/vllm/core.rs (the pass's prefill tokens,
# its ready requests, the decode load) @ f80944a4c0c32d6e8ba9ab7a58a399eae18a053a; a pass sleeps
# until its deadline as lib/mocker/src/scheduler/vllm/live.rs @ 7568efc4c9497e42f0c6f018d79738ce4a1516e5.
MAX_CATCH_UP_S = 0.05
"""After a stall (no CPU for the event loop) at most this much lost time is made up by running
steps back to back; the rest is dropped, as a real engine cannot compute faster to catch up."""


def prefill_ms(uncached_tokens: int) -> float:
    """Dynamo's polynomial prefill time for ``uncached_tokens`` new prompt tokens in a step."""
    if uncached_tokens <= 0:
        return 0.0
    t = float(uncached_tokens)
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def decode_ms(kv_load: float) -> float:
    """Dynamo's polynomial decode step time at ``kv_load`` = active KV tokens / total (floor 1 ms)."""
    return max(-25.74 * kv_load * kv_load + 54.01 * kv_load + 5.74, 1.0)


@functools.lru_cache(maxsize=8)
def _special_token_ids(model_path: str) -> frozenset[int]:
    """The special token ids of ``model_path``'s tokenizer, read once per folder (a worker with
    ``--num-workers N`` builds N engines from one model)."""
    from ..llm.tokenizer import ModelTokenizer

    return frozenset(ModelTokenizer.load(model_path).special_token_ids())


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)  # the ids it streams, cycled
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    allocation: Allocation | None = None
    hashes: tuple[list[int], list[int]] | None = None  # the prompt's block hashes, computed once
    computed: int = 0  # prompt tokens whose KV exists (cached prefix, then prefill chunks)
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission (or by the prefill)
    emitted: int = 0  # tokens handed to the stream
    cancelled: bool = False
    transferred: bool = False  # a decode: its prompt's KV came from a prefill worker
    handoff: bool = False  # a prefill worker's request: its one token is part of the prefill pass

    @property
    def prefilled(self) -> bool:
        return self.computed >= len(self.prompt)


class MockerEngine(BootstrapRole):
    """See the module docstring.

    Attributes:
        kv: the `KvBlockManager`.
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
        decode_speedup_ratio: float = 1.0,
        kv_events: KvEventSink | None = None,
        skip_token_ids: frozenset[int] = frozenset(),
        context_length: int | None = None,
        kv_timeout: float = 30.0,
    ) -> None:
        if speedup_ratio <= 0 or decode_speedup_ratio <= 0:
            raise ConfigError(
                f"--speedup-ratio and --decode-speedup-ratio must be positive, got {speedup_ratio} and "
                f"{decode_speedup_ratio}"
            )
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ConfigError(
                f"--max-num-batched-tokens and --max-num-seqs must be at least 1, got {max_num_batched_tokens} "
                f"and {max_num_seqs}"
            )
        self.kv = KvBlockManager(num_blocks, block_size)
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs: int | None = max_num_seqs
        self.context_length = context_length  # published in the card; the simulation refuses nothing
        self.kv_timeout = kv_timeout
        self.speedup_ratio = speedup_ratio
        self.decode_speedup_ratio = decode_speedup_ratio
        self.skip_token_ids = skip_token_ids
        self.kv_events = kv_events
        self.prefix_hits = 0
        self.prompt_blocks = 0
        self.steps = 0
        self.simulated_s = 0.0  # the model's time of every step run, summed
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        """Requests running or waiting."""
        return len(self._running) + len(self._waiting)

    def stats(self) -> dict[str, int]:
        """Prefix cache hits: ``prefix_hits`` of ``prompt_blocks`` admitted prompt blocks were cached."""
        return {
            "prefix_hits": self.prefix_hits,
            "prompt_blocks": self.prompt_blocks,
            "cached_blocks": self.kv.used_blocks,
            "steps": self.steps,
        }

    @classmethod
    async def from_args(
        cls,
        args: argparse.Namespace,
        model_path: str | Path | None = None,
        *,
        kv_events: KvEventSink | None = None,
    ) -> MockerEngine:
        """The engine the mocker worker's flags describe (its KV pool, scheduler limits, speed,
        ``--context-length``, ``--kv-timeout``); it streams the prompt's ids but not the special
        ones of ``model_path``'s tokenizer (they decode to no text)."""
        skip = _special_token_ids(str(model_path)) if model_path is not None else frozenset()
        return cls(
            block_size=args.kv_cache_block_size,
            num_blocks=args.num_gpu_blocks,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            speedup_ratio=args.speedup_ratio,
            decode_speedup_ratio=args.decode_speedup_ratio,
            kv_events=kv_events,
            skip_token_ids=skip,
            context_length=args.context_length,
            kv_timeout=args.kv_timeout,
        )

    def kv_snapshot(self) -> list[KvEvent]:
        """Events that rebuild the KV pool's index from empty (for a KV router's re-sync)."""
        return self.kv.snapshot()

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """Exactly ``max_tokens`` tokens (default `DEFAULT_MAX_TOKENS`, 16), the last output with usage."""
        job = _Request(request.token_ids, token_budget(request, None))
        async with contextlib.aclosing(self._stream(job, context)) as items:
            async for item in items:
                yield item

    async def _prefill_handoff(
        self, request: PreprocessedRequest, context: Context | None
    ) -> tuple[dict[str, Any], bytes]:
        """The prefill role's work (see `BootstrapRole.prefill`): the prompt through the scheduler
        (its blocks cached here), then a tensor-less handoff."""
        job = _Request(request.token_ids, 1, handoff=True)
        async with contextlib.aclosing(self._stream(job, context)) as outputs:
            tokens = [token async for output in outputs for token in output.token_ids]
        if not tokens:
            raise DisaggregationError("the prefill was cancelled before its first token")
        header = {
            "format": MOCK_KV_FORMAT,
            "prompt_tokens": len(request.token_ids),
            "first_token": tokens[0],
            "cached_tokens": job.cached_tokens,
            "payload_bytes": 0,
        }
        return header, b""

    async def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode role: the prefill's first token, then the rest of ``max_tokens`` from here."""
        header, _ = await fetch_prompt_kv(request, self.kv_timeout)
        if header.get("format") != MOCK_KV_FORMAT or not isinstance(header.get("first_token"), int):
            raise DisaggregationError(
                f"the prefill sent a {header.get('format')!r} handoff; a mocker decode needs a mocker "
                f"prefill ({MOCK_KV_FORMAT})"
            )
        job = _Request(request.token_ids, token_budget(request, None), emitted=1, transferred=True)
        job.cached_tokens = int(header.get("cached_tokens") or 0)  # what the prefill found cached
        if job.max_tokens <= 1:
            yield LLMEngineOutput.final(
                [header["first_token"]], "length", prompt_tokens=len(job.prompt), completion_tokens=1,
                cached_tokens=job.cached_tokens,
            )  # fmt: skip
            return
        yield LLMEngineOutput([header["first_token"]])
        async with contextlib.aclosing(self._stream(job, context)) as items:
            async for item in items:
                yield item

    async def _stream(self, job: _Request, context: Context | None) -> AsyncIterator[LLMEngineOutput]:
        """Queue ``job`` and stream its tokens; leaving early (cancel, close) frees it."""
        job.output = [t for t in job.prompt if t not in self.skip_token_ids] or job.prompt or [0]
        self._waiting.append(job)
        self._ensure_loop()
        received = job.emitted  # a decode's first token came from its prefill
        try:
            while True:
                token = await job.queue.get()
                if isinstance(token, Exception):
                    raise token
                received += 1
                if received >= job.max_tokens:
                    yield LLMEngineOutput.final(
                        [token], "length", prompt_tokens=len(job.prompt), completion_tokens=received,
                        cached_tokens=job.cached_tokens,
                    )  # fmt: skip
                    return
                yield LLMEngineOutput([token])
                if context is not None and context.is_stopped():
                    yield LLMEngineOutput.final(
                        [], "cancelled", prompt_tokens=len(job.prompt), completion_tokens=received,
                        cached_tokens=job.cached_tokens,
                    )  # fmt: skip
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
        loop = asyncio.get_running_loop()
        deadline: float | None = None  # when the current step ends, on the loop's clock
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                deadline = None  # idle time is not owed to anyone
                continue
            decoding = [job for job in self._running if job.prefilled and not job.cancelled]
            chunks = self._schedule(self.max_num_batched_tokens - len(decoding))
            step_s = self.step_seconds(chunks)
            self.simulated_s += step_s
            now = loop.time()
            deadline = max(now if deadline is None else deadline, now - MAX_CATCH_UP_S) + step_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self.steps += 1
            for job, tokens in chunks:
                job.computed += tokens
                if job.allocation is not None:
                    self.kv.mark_computed(job.allocation, job.computed)
            self._emit()
            await self._publish_events()

    def step_seconds(self, chunks: list[tuple[_Request, int]]) -> float:
        """How long a step with these prefill ``chunks`` lasts (Dynamo's mocker model, scaled)."""
        prefill = 0.0
        if chunks:  # Dynamo's token count: B·(Σ(prefix + chunk)//B − Σprefix//B)
            batch = len(chunks)
            total = sum(job.computed + tokens for job, tokens in chunks)
            prefix = sum(job.computed for job, _ in chunks)
            prefill = prefill_ms(batch * (total // batch - prefix // batch))
        chunk_of = {id(job): tokens for job, tokens in chunks}
        ready = [
            job
            for job in self._running
            if not job.cancelled
            and job.emitted < job.max_tokens
            and job.computed + chunk_of.get(id(job), 0) >= len(job.prompt)  # computed once this step ends
        ]
        decode = 0.0
        if ready and not all(job.handoff for job in ready):
            decode = decode_ms(self._kv_load()) / self.decode_speedup_ratio
        return (prefill + decode) / 1000.0 / self.speedup_ratio

    def _kv_load(self) -> float:
        """KV tokens held by running requests (shared prompt blocks once, plus each request's
        partial and decoded blocks) over the pool's tokens."""
        size = self.block_size
        extra = sum(
            -(-(len(job.prompt) + job.emitted) // size) - len(job.prompt) // size
            for job in self._running
            if not job.cancelled
        )
        return min(1.0, (self.kv.active_blocks + extra) / self.kv.num_blocks)

    def _schedule(self, budget: int) -> list[tuple[_Request, int]]:
        """This step's prefill chunks within ``budget`` tokens: running prefills first (chunked
        prefill), then newly admitted requests while ``max_num_seqs`` and the KV pool allow."""
        chunks = []
        for job in self._running:
            if budget <= 0:
                return chunks
            if not job.prefilled and not job.cancelled:
                tokens = min(len(job.prompt) - job.computed, budget)
                chunks.append((job, tokens))
                budget -= tokens
        while self._waiting and budget > 0 and len(self._running) < self.max_num_seqs:
            job = self._waiting[0]
            if job.cancelled:
                self._waiting.popleft()
                continue
            if job.hashes is None:
                job.hashes = self.kv.hashes(job.prompt)
            if not self.kv.can_allocate(job.prompt, job.hashes):
                if not self._running:  # an empty pool is too small: it never fits
                    self._waiting.popleft()
                    job.queue.put_nowait(
                        InvalidRequestError(
                            f"the prompt needs {len(job.prompt) // self.block_size} KV blocks and the "
                            f"mocker's pool has {self.kv.num_blocks}: raise --num-gpu-blocks or shorten it",
                            param="messages",
                        )
                    )
                    continue
                break
            self._waiting.popleft()
            job.allocation = self.kv.allocate(job.prompt, job.hashes)
            self._running.append(job)
            if job.transferred:  # its KV arrived whole: the blocks are computed, nothing to prefill
                job.computed = len(job.prompt)
                self.kv.mark_computed(job.allocation, job.computed)
                continue
            job.computed = min(job.allocation.cached_blocks * self.block_size, len(job.prompt))
            job.cached_tokens = job.computed
            self.prefix_hits += job.allocation.cached_blocks
            self.prompt_blocks += len(job.allocation.sequence)
            tokens = min(len(job.prompt) - job.computed, budget)
            chunks.append((job, tokens))
            budget -= tokens
        return chunks

    def _emit(self) -> None:
        """One token for every prefilled running request; finished and cancelled ones leave and free
        their blocks."""
        still = []
        for job in self._running:
            if not job.cancelled and job.prefilled and job.emitted < job.max_tokens:
                job.queue.put_nowait(job.output[job.emitted % len(job.output)])
                job.emitted += 1
            if job.cancelled or job.emitted >= job.max_tokens:
                if job.allocation is not None:
                    self.kv.release(job.allocation)
                    job.allocation = None
            else:
                still.append(job)
        self._running = still

    async def _publish_events(self) -> None:
        await publish_kv_events(self.kv_events, self.kv.drain_events())

    async def close(self) -> None:
        await self.stop_bootstrap()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)

    def __repr__(self) -> str:
        return f"<MockerEngine block_size={self.block_size} {self.active} active, {self.kv.used_blocks} blocks cached>"
