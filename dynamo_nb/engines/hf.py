"""The ``hf`` engine: a local Hugging Face model run with PyTorch + transformers (CPU or CUDA).

Requests are batched continuously, as vLLM schedules them: a scheduler task runs one step at a
time, in a worker thread so the event loop stays free, and hands each new token to its stream.
A step runs every decoding sequence in one batched forward pass (`hf_batch`) and the prompts
waiting for their KV in another (`hf_prefill`), within a token budget
(``max_num_batched_tokens``, decodes first); a prompt longer than what is left is prefilled in
chunks over several steps (``enable_chunked_prefill``), so running decodes get a token every
step. The step's tokens are sampled on the device and reach the host in one transfer
(`hf_sampling`). Sequences join and leave between steps; a short request finishes while a long
one runs; a request's greedy output does not depend on what it was batched with or how its
prompt was chunked. Cancelling a stream drops its sequence and KV cache at once.

Example::

    engine = await HFEngine.load(tiny_model_path())
    request = PreprocessedRequest([5, 6], StopConditions(max_tokens=2), SamplingOptions(temperature=0))
    [output.token_ids async for output in engine.generate(request)]       # [[311], [87]]
    await serve_llm(endpoint, engine.generate, tiny_model_path())          # as a worker
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import logging
import random
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..disagg import KVLayout, pack_kv, unpack_kv
from ..disagg.decode import fetch_prompt_kv
from ..disagg.prefill import BootstrapRole
from ..errors import ConfigError, EngineError
from ..llm.card import check_model_dir
from ..llm.limits import RequestLimits
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest, SamplingOptions
from ..runtime.context import Context
from ..runtime.streams import closing
from ..settings import env_default
from .base import KvEvent, KvEventSink, token_budget
from .hf_batch import DecodeBatch, can_batch
from .hf_prefill import PrefillRow, plan_prefill, prefill_rows
from .hf_sampling import sample_rows
from .kv_cache.blocks import publish_kv_events
from .kv_cache.prefix import PrefixCache, PrefixHit
from .model_calls import attention_kernels, forward_with_cache, new_kv_cache

__all__ = ["HFEngine"]

logger = logging.getLogger("dynamo_nb.engines.hf")


@dataclass
class _Sequence:
    """One running request: its tokens, KV cache, sampler and the queue its stream reads."""

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

    @property
    def decoding(self) -> bool:
        """Whether its whole prompt is in its KV cache (it gets a token each step)."""
        return self.cache is not None and self.prefilled >= len(self.prompt)


class HFEngine(BootstrapRole):
    """Runs a causal LM from a local folder; ``generate`` is its endpoint handler.

    Attributes:
        prefix_cache: the `PrefixCache` of full prompt blocks (None when prefix caching is off).
        kv_events: where the prefix cache's KV events go (a `KvEventPublisher`'s ``publish``), so
            a KV router follows this engine's cache; None: nowhere.
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str,
        eos_token_ids: list[int],
        max_num_seqs: int = 64,
        block_size: int = 16,
        prefix_cache: PrefixCache | None = None,
        kv_events: KvEventSink | None = None,
        batch_decode: bool = True,
        kv_timeout: float = 30.0,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
    ) -> None:
        """Use `HFEngine.load`."""
        _check_budget(max_num_seqs, max_num_batched_tokens)
        self.model = model
        self.prefix_cache = prefix_cache
        self.kv_events = kv_events
        if prefix_cache is not None:  # a sink that hashes tokens itself (NVIDIA Dynamo's publisher)
            prefix_cache.blocks.event_token_ids = bool(getattr(kv_events, "wants_token_ids", False))
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.context_length: int | None = getattr(model.config, "max_position_embeddings", None)
        self.max_num_seqs: int | None = max_num_seqs
        self.block_size: int | None = block_size
        self.kv_timeout = kv_timeout
        self._admission = asyncio.Semaphore(max_num_seqs)
        self._active: dict[int, _Sequence] = {}
        self._ids = itertools.count(1)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dynamo_nb-hf")
        self._scheduler: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._layout = KVLayout.of(model.config)
        self.steps_total = 0
        self.batch_decode = batch_decode  # one forward pass for every decoding sequence per step
        self.batched_steps = 0  # steps whose decodes ran as one batch
        self.max_num_batched_tokens = max_num_batched_tokens  # a step's tokens: decodes, then prompt chunks
        self.enable_chunked_prefill = enable_chunked_prefill
        self.prefill_passes = 0  # forward passes that prefilled prompt chunks
        self.prefill_chunks = 0  # prompt chunks those passes ran (more than passes: prefills batched)
        self._batch = DecodeBatch(model)  # the decoding sequences, stacked (engine thread only)
        self._left: list[_Sequence] = []  # sequences that left since the last step (may hold prefix blocks)

    @classmethod
    async def load(
        cls,
        model_path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_num_seqs: int = 64,
        prefix_cache_blocks: int = 1024,
        block_size: int = 16,
        kv_events: KvEventSink | None = None,
        kv_timeout: float = 30.0,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
    ) -> HFEngine:
        """Load the model in ``model_path`` off the event loop.

        Args:
            device: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda[:N]``.
            dtype: ``auto`` (float32 on CPU, bfloat16 on CUDA), ``float32``, ``float16`` or ``bfloat16``.
            max_num_seqs: requests running at once; more wait for a slot.
            prefix_cache_blocks: full prompt blocks whose KV is kept for reuse (0: no prefix cache).
            block_size: tokens per block (the model card's ``kv_cache_block_size``).
            kv_events: where the prefix cache's KV events go (e.g. a `KvEventPublisher`'s ``publish``).
            kv_timeout: seconds the decode role waits for its prefill's KV.
            max_num_batched_tokens: tokens a step runs, its decodes' first, then prompt chunks
                (vLLM's flag of that name).
            enable_chunked_prefill: prefill a prompt longer than what a step has left in chunks
                over several steps (else it waits for a step with room).
        """
        folder = check_model_dir(model_path)
        _check_budget(max_num_seqs, max_num_batched_tokens)
        if prefix_cache_blocks < 0 or block_size < 1:
            raise ConfigError(
                f"prefix_cache_blocks must be 0 or more and block_size at least 1, got "
                f"{prefix_cache_blocks} and {block_size}"
            )
        model, device_name, eos = await asyncio.to_thread(_load_model, folder, device, dtype)
        logger.info("loaded %s on %s", folder, device_name)
        prefix_cache = (
            PrefixCache(prefix_cache_blocks, block_size, model.config) if prefix_cache_blocks else None
        )
        return cls(
            model,
            device=device_name,
            eos_token_ids=eos,
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            prefix_cache=prefix_cache,
            kv_events=kv_events,
            kv_timeout=kv_timeout,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
        )

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the hf engine's own flags that `from_args` reads (``--device``, ``--dtype``, the
        prefix cache; ``--kv-timeout`` comes with every engine worker): an `dynamo_nb.EngineProgram`
        of this class or a subclass gets them."""
        group = parser.add_argument_group("hf engine")
        group.add_argument(
            "--device",
            default=env_default("DEVICE", "auto"),
            help="auto (CUDA when present) | cpu | cuda[:N] (default: %(default)s)",
        )
        group.add_argument(
            "--dtype", default="auto", help="auto | float32 | float16 | bfloat16 (default: %(default)s)"
        )
        group.add_argument(
            "--prefix-cache-blocks",
            type=int,
            default=1024,
            help="full prompt blocks whose KV is kept for reuse by later prompts, with KV events for "
            "KV routing (default: %(default)s)",
        )
        group.add_argument(
            "--no-enable-prefix-caching",
            action="store_true",
            help="no prefix cache, as --prefix-cache-blocks 0 (default: off, prefix caching on)",
        )
        group.add_argument(
            "--max-num-batched-tokens",
            type=int,
            default=2048,
            help="tokens a step runs: one per decoding request, the rest for prompts waiting to be "
            "prefilled, batched in one forward pass (as vLLM's flag) (default: %(default)s)",
        )
        group.add_argument(
            "--enable-chunked-prefill",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="prefill a prompt longer than what a step has left in chunks over several steps, so "
            "running requests keep getting a token every step (default: on)",
        )

    @classmethod
    async def from_args(
        cls, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> HFEngine:
        """The engine the worker flags describe (``--device``, ``--dtype``, ``--max-num-seqs``, the prefix
        cache, ``--kv-timeout``, ``--max-num-batched-tokens``, ``--enable-chunked-prefill``)."""
        return await cls.load(
            model_path,
            device=args.device,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            prefix_cache_blocks=0 if args.no_enable_prefix_caching else args.prefix_cache_blocks,
            block_size=args.kv_cache_block_size,
            kv_events=kv_events,
            kv_timeout=args.kv_timeout,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
        )

    @property
    def active(self) -> int:
        """Sequences running now (a cancelled one leaves at once)."""
        return len(self._active)

    def stats(self) -> dict[str, int]:
        """Prefix cache hits (``prefix_hits`` of ``prompt_blocks`` full prompt blocks reused), model
        steps, sequences running (``active``), bootstrap rooms held and KV caches handed to a decode
        (``kv_served``; a prefill worker)."""
        cache = self.prefix_cache
        return {
            "prefix_hits": cache.prefix_hits if cache else 0,
            "prompt_blocks": cache.prompt_blocks if cache else 0,
            "cached_blocks": cache.cached_blocks if cache else 0,
            "steps": self.steps_total,
            "batched_steps": self.batched_steps,
            "prefill_passes": self.prefill_passes,
            "prefill_chunks": self.prefill_chunks,
            "active": self.active,
            "bootstrap_rooms": self.bootstrap.rooms if self.bootstrap is not None else 0,
            "kv_served": self.bootstrap.served_total if self.bootstrap is not None else 0,
        }

    def kv_snapshot(self) -> list[KvEvent]:
        """Events that rebuild the prefix cache's index from empty (for a KV router's re-sync)."""
        return self.prefix_cache.snapshot() if self.prefix_cache else []

    async def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """One output per new token; the last has ``finish_reason`` and usage."""
        self.check_request(request)
        async with self._admission:
            seq = self._new_sequence(request, token_budget(request, self.context_length))
            async with closing(self._stream(seq, context)) as items:  # closed with this stream
                async for item in items:
                    yield item

    async def _prefill_handoff(
        self, request: PreprocessedRequest, context: Context | None
    ) -> tuple[dict[str, Any], bytes]:
        """The prefill role's work (see `BootstrapRole.prefill`): the prompt's KV and first token, packed."""
        async with self._admission:
            seq = self._new_sequence(request, 1)
            try:
                token, _finish = await self._next_token(seq)
                layers = [(layer.keys, layer.values) for layer in seq.cache.layers]
                header, payload = await asyncio.get_running_loop().run_in_executor(
                    self._executor, functools.partial(pack_kv, layers, first_token=token)
                )
                header["cached_tokens"] = seq.cached_tokens  # the decode reports what the prefill reused
                return header, payload
            finally:
                self._leave(seq)

    async def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """The decode role: fetch the prompt's KV cache from the prefill's bootstrap server, go on.

        Takes ``bootstrap_info`` (fast path) or ``prefill_result.disaggregated_params``
        (fallback path); streams like `generate`, starting with the prefill's first token.
        """
        self.check_request(request)
        header, payload = await fetch_prompt_kv(request, self.kv_timeout)
        loop = asyncio.get_running_loop()
        cache = await loop.run_in_executor(self._executor, self._import_cache, header, payload)
        async with self._admission:
            seq = self._new_sequence(request, token_budget(request, self.context_length))
            seq.cache, seq.last_token, seq.generated = cache, header["first_token"], 1
            seq.prefilled = len(seq.prompt)
            seq.cached_tokens = int(header.get("cached_tokens") or 0)
            _check_finish(seq, seq.last_token)
            if seq.finish is not None:
                yield LLMEngineOutput.final(
                    [seq.last_token], seq.finish, prompt_tokens=len(seq.prompt), completion_tokens=1,
                    cached_tokens=seq.cached_tokens,
                )  # fmt: skip
                return
            yield LLMEngineOutput([seq.last_token])
            async with closing(self._stream(seq, context)) as items:  # closed with this stream
                async for item in items:
                    yield item

    def check_request(self, request: PreprocessedRequest) -> None:
        """Refuse token ids outside the model's vocabulary (`InvalidRequestError`)."""
        RequestLimits(vocab_size=self.model.config.vocab_size).check(request)

    def _new_sequence(self, request: PreprocessedRequest, budget: int) -> _Sequence:
        stop = request.stop_conditions
        eos = frozenset() if stop.ignore_eos else frozenset(request.eos_token_ids or self.eos_token_ids)
        return _Sequence(
            seq_id=next(self._ids),
            prompt=request.token_ids,
            budget=budget,
            sampling=request.sampling_options,
            eos=eos,
            min_tokens=stop.min_tokens,
            queue=asyncio.Queue(),
            generator=_make_generator(self.device, request.sampling_options.seed),
        )

    async def _next_token(self, seq: _Sequence) -> tuple[int, str | None]:
        """Schedule ``seq`` (if it is not yet) and wait for its next token."""
        if seq.seq_id not in self._active:
            self._active[seq.seq_id] = seq
            self._ensure_scheduler()
        token, finish = await seq.queue.get()
        if isinstance(token, BaseException):
            raise token
        return token, finish

    async def _stream(self, seq: _Sequence, context: Context | None) -> AsyncIterator[LLMEngineOutput]:
        """Run ``seq`` to its end, one output per token; it leaves the scheduler however it ends."""
        prompt_tokens = len(seq.prompt)
        sent = seq.generated  # tokens already out (a decode's first token); the scheduler may run ahead
        try:
            while True:
                token, finish = await self._next_token(seq)
                if finish is not None:
                    yield LLMEngineOutput.final(
                        [token], finish, prompt_tokens=prompt_tokens, completion_tokens=seq.generated,
                        cached_tokens=seq.cached_tokens,
                    )  # fmt: skip
                    return
                yield LLMEngineOutput([token])
                sent += 1
                if context is not None and context.is_stopped():
                    yield LLMEngineOutput.final(
                        [], "cancelled", prompt_tokens=prompt_tokens, completion_tokens=sent,
                        cached_tokens=seq.cached_tokens,
                    )  # fmt: skip
                    return
        finally:
            self._leave(seq)

    def _leave(self, seq: _Sequence) -> None:
        """``seq`` is done (ended, cancelled or failed): it leaves the scheduler and drops its KV;
        prefix blocks it holds are let go by the engine thread at its next step (a step under way
        may still be running it)."""
        seq.left = True
        self._active.pop(seq.seq_id, None)
        seq.cache = None
        self._left.append(seq)

    def _import_cache(self, header: dict[str, Any], payload: bytes) -> Any:
        """A DynamicCache from a received KV payload (runs in the engine's thread)."""
        from transformers import DynamicCache

        layers = unpack_kv(header, payload, expect=self._layout, device=self.device)
        model_dtype = next(self.model.parameters()).dtype
        layers = [(k.to(model_dtype), v.to(model_dtype)) for k, v in layers]
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def _ensure_scheduler(self) -> None:
        self._wake.set()
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_running_loop().create_task(
                self._schedule(), name="dynamo_nb-hf-scheduler"
            )

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = list(self._active.values())
            try:
                results = await loop.run_in_executor(self._executor, self._step_all, batch)
            except Exception as exc:  # the model failed: every running stream gets the error
                logger.exception("model step failed")
                error = EngineError(f"the model step failed: {exc!r}")
                for seq in batch:
                    seq.queue.put_nowait((error, None))
                    self._leave(seq)
                continue
            for seq, token in results:
                if self._active.get(seq.seq_id) is seq:
                    seq.queue.put_nowait((token, seq.finish))
                    if seq.finish is not None:
                        self._active.pop(seq.seq_id, None)
            await self._publish_events()

    async def _publish_events(self) -> None:
        if self.prefix_cache is not None:
            await publish_kv_events(self.kv_events, self.prefix_cache.drain_events())

    def _step_all(self, batch: list[_Sequence]) -> list[tuple[_Sequence, int]]:
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
        sampled: list[_Sequence] = []
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
            _check_finish(seq, token)
        return list(zip(sampled, tokens, strict=True))

    def _decode(self, decoding: list[_Sequence]) -> tuple[list[_Sequence], Any]:
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

    def _prefill(self, waiting: list[_Sequence], decodes: int) -> tuple[list[_Sequence], Any]:
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

    def _begin_prefill(self, seq: _Sequence) -> None:
        """``seq``'s KV cache to start from: its prompt's cached prefix, or empty."""
        if self.prefix_cache is None:
            seq.cache = new_kv_cache(self.model)
            return
        seq.hit = self.prefix_cache.begin(seq.prompt)
        seq.cache, seq.prefilled = seq.hit.past, seq.hit.reused
        seq.cached_tokens = seq.hit.reused

    def _abandon_prefix(self, seq: _Sequence) -> None:
        """Let go of the prefix blocks ``seq`` holds, caching nothing new (its prefill failed or it left)."""
        if seq.hit is not None and self.prefix_cache is not None:
            self.prefix_cache.abandon(seq.hit)
        seq.hit = None

    def _let_go_of_left_prefixes(self) -> None:
        while self._left:
            self._abandon_prefix(self._left.pop())

    def _join_batch(self, decoding: list[_Sequence]) -> list[_Sequence] | None:
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

    def _own_cache(self, seq: _Sequence) -> Any:
        """``seq``'s KV cache as its own ``DynamicCache`` (taken out of the batch if it is in it)."""
        return self._batch.cache_of(seq.seq_id) if seq.cache is self._batch else seq.cache

    async def close(self) -> None:
        """Stop the scheduler and the bootstrap server, release the model thread."""
        await self.stop_bootstrap()
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __repr__(self) -> str:
        name = type(self).__name__ if type(self) is HFEngine else f"{type(self).__name__}(HFEngine)"
        return f"<{name} {self.model.config.model_type} on {self.device}, {self.active} active>"


def _check_finish(seq: _Sequence, token: int) -> None:
    """Set ``seq.finish`` when ``token`` (its latest) ends it: an eos past min_tokens, or the budget."""
    if token in seq.eos and seq.generated > seq.min_tokens:
        seq.finish = "stop"
    elif seq.generated >= seq.budget:
        seq.finish = "length"


def _make_generator(device: str, seed: int | None) -> Any:
    import torch

    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else random.getrandbits(63))
    return generator


def _check_budget(max_num_seqs: int, max_num_batched_tokens: int) -> None:
    if max_num_seqs < 1 or max_num_batched_tokens < 1:
        raise ConfigError(
            f"max_num_seqs and max_num_batched_tokens must be at least 1, got {max_num_seqs} and "
            f"{max_num_batched_tokens}"
        )


def _load_model(folder: Path, device: str, dtype: str) -> tuple[Any, str, list[int]]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' asked for, but torch sees no CUDA device: use --device cpu or auto")
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype == "auto":
        torch_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    elif dtype in dtypes:
        torch_dtype = dtypes[dtype]
    else:
        raise ConfigError(f"unknown dtype {dtype!r}: use auto, {', '.join(dtypes)}")
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).to(device).eval()
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = model.config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return model, device, eos_ids
