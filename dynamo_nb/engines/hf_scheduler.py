"""The hf engine's step scheduler: every running request advanced a step at a time, as vLLM
schedules (the mocker's is `dynamo_nb.engines.mocker_scheduler`).

A step runs on the engine's one model thread: the decoding sequences get their next token from
one batched forward pass (a `DecodeBatch`, into which only joining sequences are copied), the
prompts waiting for their KV run their planned chunks in another within the step's token budget
(`plan_prefill`: decodes first, long prompts in chunks), and the step's tokens are sampled
together and copied to the host once. The event loop side wakes the scheduler when a sequence
arrives and hands each sequence its tokens through its queue; the prefix cache's blocks a
sequence holds are let go on the model thread.

Example::

    scheduler = StepScheduler(model, "cpu", executor, prefix_cache=None, kv_events=None)
    token, finish = await scheduler.next_token(sequence)     # schedules it, waits for a token
    scheduler.leave(sequence)                                # ended: it runs no more
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError
from ..llm.protocol import SamplingOptions
from .base import KvEventSink
from .hf_batch import DecodeBatch, can_batch
from .hf_grammar import GrammarMatcher
from .hf_prefill import PrefillRow, plan_prefill, prefill_rows
from .hf_sampling import sample_rows
from .kv_cache.blocks import publish_kv_events
from .kv_cache.prefix import PrefixCache, PrefixHit
from .model_calls import attention_kernels, forward_with_cache, new_kv_cache

__all__ = ["StepScheduler", "StepSequence", "check_finish"]

logger = logging.getLogger("dynamo_nb.engines.hf")


@dataclass
class StepSequence:
    """One running request: its tokens, KV cache, sampler and the queue its stream reads (its
    stream reads ``(token, finish)`` pairs, or ``(error, None)``)."""

    seq_id: int
    prompt: list[int]
    budget: int
    sampling: SamplingOptions
    eos: frozenset[int]
    min_tokens: int
    queue: asyncio.Queue[Any]
    generator: Any
    cache: Any = None
    prefilled: int = 0  # prompt tokens whose KV is in ``cache``
    hit: PrefixHit | None = None  # the prefix cache's blocks, held from the first chunk to the last
    last_token: int = -1
    generated: int = 0
    finish: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (or the prefill's)
    left: bool = False  # ended, cancelled or failed: no step runs it again
    grammar: GrammarMatcher | None = None  # structured output: its logits masked each step

    @property
    def decoding(self) -> bool:
        """Whether its whole prompt is in its KV cache (it gets a token each step)."""
        return self.cache is not None and self.prefilled >= len(self.prompt)


class StepScheduler:
    """Runs the hf engine's sequences a step at a time (see the module docstring).

    Attributes:
        active: the sequences running now, by id.
        batch_decode: one forward pass for every decoding sequence per step (else one each).
        max_num_batched_tokens: a step's tokens: its decodes first, then prompt chunks.
        enable_chunked_prefill: a prompt longer than what a step has left runs in chunks.
        steps_total, batched_steps, prefill_passes, prefill_chunks: steps run; those whose
            decodes ran as one batch; forward passes that prefilled prompt chunks; the chunks
            they ran (more than passes: prefills batched).
    """

    def __init__(
        self,
        model: Any,
        device: str,
        executor: ThreadPoolExecutor,
        *,
        prefix_cache: PrefixCache | None,
        kv_events: KvEventSink | None,
        batch_decode: bool = True,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.model = model
        self.device = device
        self.prefix_cache = prefix_cache
        self.kv_events = kv_events
        self.batch_decode = batch_decode
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.active: dict[int, StepSequence] = {}
        self.steps_total = 0
        self.batched_steps = 0
        self.prefill_passes = 0
        self.prefill_chunks = 0
        self._executor = executor
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._batch = DecodeBatch(model)  # the decoding sequences, stacked (engine thread only)
        self._left: list[
            StepSequence
        ] = []  # sequences that left since the last step (may hold prefix blocks)

    async def next_token(self, seq: StepSequence) -> tuple[int, str | None]:
        """Schedule ``seq`` (if it is not yet) and wait for its next token and whether it ended."""
        if seq.seq_id not in self.active:
            self.active[seq.seq_id] = seq
            self._ensure_running()
        token, finish = await seq.queue.get()
        if isinstance(token, BaseException):
            raise token
        return token, finish

    def leave(self, seq: StepSequence) -> None:
        """``seq`` is done (ended, cancelled or failed): it leaves the scheduler and drops its KV;
        prefix blocks it holds are let go by the model thread at its next step (a step under way
        may still be running it)."""
        seq.left = True
        self.active.pop(seq.seq_id, None)
        seq.cache = None
        self._left.append(seq)

    async def stop(self) -> None:
        """Stop scheduling (the engine's ``close``)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _ensure_running(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._schedule(), name="dynamo_nb-hf-scheduler"
            )

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.active:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = list(self.active.values())
            try:
                results = await loop.run_in_executor(self._executor, self._step_all, batch)
            except Exception as exc:  # the model failed: every running stream gets the error
                logger.exception("model step failed")
                error = EngineError(f"the model step failed: {exc!r}")
                for seq in batch:
                    seq.queue.put_nowait((error, None))
                    self.leave(seq)
                continue
            for seq, token in results:
                if self.active.get(seq.seq_id) is seq:
                    seq.queue.put_nowait((token, seq.finish))
                    if seq.finish is not None:
                        self.active.pop(seq.seq_id, None)
            await self._publish_events()

    async def _publish_events(self) -> None:
        if self.prefix_cache is not None:
            await publish_kv_events(self.kv_events, self.prefix_cache.drain_events())

    def _step_all(self, batch: list[StepSequence]) -> list[tuple[StepSequence, int]]:
        """One step (runs in the engine's thread): every decoding sequence in ``batch`` gets its
        next token from one batched forward pass (a `DecodeBatch`, into which only joining
        sequences are copied), and the prompts waiting for their KV run their planned chunks in another
        (`plan_prefill`, `prefill_rows`); a prompt whose last chunk ran gets its first token. The
        tokens are sampled together and copied to the host once. Returns (sequence, token) pairs."""
        import torch

        self._let_go_of_left_prefixes()
        batch = [seq for seq in batch if not seq.left]  # (after the let-go: one that left now waits)
        decoding = [seq for seq in batch if seq.decoding]
        waiting = [seq for seq in batch if not seq.decoding]
        sampled: list[StepSequence] = []
        logits: list[Any] = []
        try:
            with torch.inference_mode(), attention_kernels(self.device):
                if decoding:
                    ordered, decode_logits = self._decode(decoding)
                    logits.append(decode_logits)
                    sampled += ordered
                if waiting:
                    ready, ready_logits = self._prefill(waiting, decodes=len(decoding))
                    if ready:
                        logits.append(ready_logits)
                        sampled += ready
                if not sampled:
                    self.steps_total += 1
                    return []
                rows = logits[0] if len(logits) == 1 else torch.cat(logits)
                for row, seq in enumerate(sampled):
                    if seq.grammar is not None:  # structured output: only what its grammar allows
                        seq.grammar.mask(rows[row])
                tokens = sample_rows(
                    rows, [seq.sampling for seq in sampled], [seq.generator for seq in sampled]
                ).tolist()  # the step's one device-to-host copy
        except BaseException:
            self._batch.clear()  # its members fail with the step
            for seq in waiting:
                self._abandon_prefix(seq)
            raise
        self.steps_total += 1
        for seq, token in zip(sampled, tokens, strict=True):
            seq.last_token = token
            seq.generated += 1
            check_finish(seq, token)
            self.advance_grammar(seq, token)
        return list(zip(sampled, tokens, strict=True))

    @staticmethod
    def advance_grammar(seq: StepSequence, token: int) -> None:
        """Move ``seq``'s grammar past ``token`` (a step's, or a decode's first token, which its
        prefill drew under the same grammar); a complete grammar ends the sequence (``stop``)."""
        if seq.grammar is None:
            return
        seq.grammar.accept(token)
        if seq.grammar.finished and seq.finish is None:
            seq.finish = "stop"

    def _decode(self, decoding: list[StepSequence]) -> tuple[list[StepSequence], Any]:
        """The decoding sequences' next-token logits: the sequences (in row order) and one row each."""
        import torch

        if self.batch_decode and len(decoding) > 1:
            ordered = self._join_batch(decoding)
            if ordered is not None:
                self.batched_steps += 1
                return ordered, self._batch.step([seq.last_token for seq in ordered])
        rows = []
        for seq in decoding:
            seq.cache = self._own_cache(seq)
            input_ids = torch.tensor([[seq.last_token]], device=self.device)
            rows.append(forward_with_cache(self.model, seq.cache, input_ids=input_ids).logits[0, -1])
        self._batch.clear()
        return decoding, torch.stack(rows)

    def _prefill(self, waiting: list[StepSequence], decodes: int) -> tuple[list[StepSequence], Any]:
        """Run this step's prompt chunks (`plan_prefill` within the budget the ``decodes`` left) in
        one forward pass; the sequences whose prompt is now whole, and their logits."""
        for seq in waiting:
            if seq.cache is None:  # a first chunk: start from the prompt's cached prefix
                self._begin_prefill(seq)
        sizes = plan_prefill(
            [len(seq.prompt) - seq.prefilled for seq in waiting],
            self.max_num_batched_tokens,
            decodes=decodes,
            chunked=self.enable_chunked_prefill,
        )
        chunked = waiting[: len(sizes)]
        rows = [
            PrefillRow(seq.cache, seq.prompt[seq.prefilled : seq.prefilled + size])
            for seq, size in zip(chunked, sizes, strict=True)
        ]
        logits, caches = prefill_rows(self.model, rows)
        self.prefill_passes += 1
        self.prefill_chunks += len(rows)
        ready = []
        for index, (seq, size, cache) in enumerate(zip(chunked, sizes, caches, strict=True)):
            seq.cache, seq.prefilled = cache, seq.prefilled + size
            if seq.decoding:
                ready.append(index)
                if seq.hit is not None and self.prefix_cache is not None:
                    self.prefix_cache.finish(seq.hit, cache)
                    seq.hit = None
        if len(ready) == len(rows):
            return chunked, logits
        return [chunked[index] for index in ready], logits[ready]

    def _begin_prefill(self, seq: StepSequence) -> None:
        """``seq``'s KV cache to start from: its prompt's cached prefix, or empty."""
        if self.prefix_cache is None:
            seq.cache = new_kv_cache(self.model)
            return
        seq.hit = self.prefix_cache.begin(seq.prompt)
        seq.cache, seq.prefilled = seq.hit.past, seq.hit.reused
        seq.cached_tokens = seq.hit.reused

    def _abandon_prefix(self, seq: StepSequence) -> None:
        """Let go of the prefix blocks ``seq`` holds, caching nothing new (its prefill failed or it left)."""
        if seq.hit is not None and self.prefix_cache is not None:
            self.prefix_cache.abandon(seq.hit)
        seq.hit = None

    def _let_go_of_left_prefixes(self) -> None:
        while self._left:
            self._abandon_prefix(self._left.pop())

    def _join_batch(self, decoding: list[StepSequence]) -> list[StepSequence] | None:
        """Make ``decoding`` the decode batch's members (those that left leave, new ones join);
        the sequences in the batch's row order, or None when a joining cache cannot share a
        forward pass (see `can_batch`: everyone then runs alone)."""
        by_id = {seq.seq_id: seq for seq in decoding}
        joining = [seq for seq in decoding if seq.cache is not self._batch]
        if joining or len(self._batch.ids) != len(by_id):
            if not can_batch([seq.cache for seq in joining]):
                for seq in decoding:
                    seq.cache = self._own_cache(seq)
                self._batch.clear()
                return None
            self._batch.update(set(by_id), [(seq.seq_id, seq.cache) for seq in joining])
            for seq in joining:
                seq.cache = self._batch  # its KV lives in the batch until it runs alone again
        return [by_id[seq_id] for seq_id in self._batch.ids]

    def _own_cache(self, seq: StepSequence) -> Any:
        """``seq``'s KV cache as its own ``DynamicCache`` (taken out of the batch if it is in it)."""
        return self._batch.cache_of(seq.seq_id) if seq.cache is self._batch else seq.cache


def check_finish(seq: StepSequence, token: int) -> None:
    """Set ``seq.finish`` when ``token`` (its latest) ends it: an eos past min_tokens, or the budget."""
    if token in seq.eos and seq.generated > seq.min_tokens:
        seq.finish = "stop"
    elif seq.generated >= seq.budget:
        seq.finish = "length"
