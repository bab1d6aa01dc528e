"""The ``hf`` engine: a local Hugging Face model run with PyTorch + transformers (CPU or CUDA).

Requests are batched continuously, as vLLM schedules them: a scheduler (`hf_scheduler`, as the
mocker's is its own module) runs one step at a time, in a worker thread so the event loop stays
free, and hands each new token to its stream; this module is the Engine API around it (the
model loaded, requests in, tokens out, the prefill and decode roles).
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
from ..errors import ConfigError, InvalidRequestError
from ..llm.card import check_model_dir
from ..llm.limits import RequestLimits
from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from ..runtime.streams import closing
from ..settings import Settings, add_settings, at_least, setting
from .base import EngineLimits, KvEvent, KvEventSink, token_budget
from .hf_grammar import GrammarMatcher, Grammars
from .hf_scheduler import StepScheduler, StepSequence, check_finish
from .kv_cache.prefix import PrefixCache

__all__ = ["HFEngine", "HFSettings"]

logger = logging.getLogger("dynamo_nb.engines.hf")

_GROUP = "hf engine"


@dataclass(frozen=True)
class HFSettings(Settings):
    """The hf engine's own settings, each a flag of its worker (see `dynamo_nb.settings`).

    Example:
        >>> HFSettings(max_num_batched_tokens=0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: max_num_batched_tokens (--max-num-batched-tokens) must be at least 1, got 0
    """

    device: str = setting(
        "auto", flag="--device", env="DEVICE", group=_GROUP, help="auto (CUDA when present) | cpu | cuda[:N]"
    )
    dtype: str = setting("auto", flag="--dtype", group=_GROUP, help="auto | float32 | float16 | bfloat16")
    prefix_cache_blocks: int = setting(
        1024,
        flag="--prefix-cache-blocks",
        group=_GROUP,
        check=at_least(0),
        help="full prompt blocks whose KV is kept for reuse by later prompts, with KV events for KV routing",
    )
    enable_prefix_caching: bool = setting(
        True,
        flag="--no-enable-prefix-caching",
        negate=True,
        group=_GROUP,
        default_text="off, prefix caching on",
        help="no prefix cache, as --prefix-cache-blocks 0",
    )
    max_num_batched_tokens: int = setting(
        2048,
        flag="--max-num-batched-tokens",
        group=_GROUP,
        check=at_least(1),
        help="tokens a step runs: one per decoding request, the rest for prompts waiting to be prefilled, "
        "batched in one forward pass (as vLLM's flag)",
    )
    enable_chunked_prefill: bool = setting(
        True,
        flag="--enable-chunked-prefill",
        both_ways=True,
        group=_GROUP,
        default_text="on",
        help="prefill a prompt longer than what a step has left in chunks over several steps, so running "
        "requests keep getting a token every step",
    )


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
        model_folder: str | Path | None = None,
    ) -> None:
        """Use `HFEngine.load`; ``model_folder`` (its ``tokenizer.json``) makes structured output possible."""
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
        self.model_folder = model_folder
        self._grammars: Grammars | None = None  # made at the first structured-output request
        self._admission = asyncio.Semaphore(max_num_seqs)
        self._ids = itertools.count(1)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dynamo_nb-hf")
        self._layout = KVLayout.of(model.config)
        self.scheduler = StepScheduler(
            model,
            device,
            self._executor,
            prefix_cache=prefix_cache,
            kv_events=kv_events,
            batch_decode=batch_decode,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
        )
        """Runs the requests a step at a time (`dynamo_nb.engines.hf_scheduler.StepScheduler`):
        its counters (``steps_total``, ``batched_steps``, ``prefill_passes``, ``prefill_chunks``)
        and its step settings (``batch_decode``, ``max_num_batched_tokens``, ``enable_chunked_prefill``)."""

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
            model_folder=folder,
        )

    @property
    def enforces_guided_decoding(self) -> bool:
        """Whether requests may carry ``guided_decoding`` (structured output): with its model's folder."""
        return self.model_folder is not None

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the hf engine's own flags that `from_args` reads (`HFSettings`' fields: ``--device``,
        ``--dtype``, the prefix cache, the step's token budget; ``--kv-timeout`` comes with every
        engine worker): an `dynamo_nb.EngineProgram` of this class or a subclass gets them."""
        add_settings(parser, HFSettings)

    @classmethod
    async def from_args(
        cls, args: argparse.Namespace, model_path: str | Path, *, kv_events: KvEventSink | None = None
    ) -> HFEngine:
        """The engine the worker flags describe (`HFSettings`, and every engine worker's
        ``--max-num-seqs``, ``--kv-cache-block-size`` and ``--kv-timeout``)."""
        own, limits = HFSettings.from_args(args), EngineLimits.from_args(args)
        return await cls.load(
            model_path,
            device=own.device,
            dtype=own.dtype,
            max_num_seqs=limits.max_num_seqs,
            prefix_cache_blocks=own.prefix_cache_blocks if own.enable_prefix_caching else 0,
            block_size=limits.block_size,
            kv_events=kv_events,
            kv_timeout=args.kv_timeout,
            max_num_batched_tokens=own.max_num_batched_tokens,
            enable_chunked_prefill=own.enable_chunked_prefill,
        )

    @property
    def active(self) -> int:
        """Sequences running now (a cancelled one leaves at once)."""
        return len(self.scheduler.active)

    def stats(self) -> dict[str, int]:
        """Prefix cache hits (``prefix_hits`` of ``prompt_blocks`` full prompt blocks reused), model
        steps, sequences running (``active``), bootstrap rooms held and KV caches handed to a decode
        (``kv_served``; a prefill worker)."""
        cache = self.prefix_cache
        return {
            "prefix_hits": cache.prefix_hits if cache else 0,
            "prompt_blocks": cache.prompt_blocks if cache else 0,
            "cached_blocks": cache.cached_blocks if cache else 0,
            "steps": self.scheduler.steps_total,
            "batched_steps": self.scheduler.batched_steps,
            "prefill_passes": self.scheduler.prefill_passes,
            "prefill_chunks": self.scheduler.prefill_chunks,
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
            seq = self._new_sequence(request, 1)  # structured output: its grammar masks the first token
            try:
                token, _finish = await self.scheduler.next_token(seq)
                layers = [(layer.keys, layer.values) for layer in seq.cache.layers]
                header, payload = await asyncio.get_running_loop().run_in_executor(
                    self._executor, functools.partial(pack_kv, layers, first_token=token)
                )
                header["cached_tokens"] = seq.cached_tokens  # the decode reports what the prefill reused
                return header, payload
            finally:
                self.scheduler.leave(seq)

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
            check_finish(seq, seq.last_token)
            self.scheduler.advance_grammar(seq, seq.last_token)  # the grammar goes on past the first token
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

    def _grammar(self, request: PreprocessedRequest) -> GrammarMatcher | None:
        """The matcher of the request's structured output (None: it asks for none)."""
        guided = request.guided_decoding
        if guided is None:
            return None
        if self.model_folder is None:
            raise InvalidRequestError(
                "structured output needs the engine's model folder (HFEngine.load makes it so)",
                "guided_decoding",
            )
        if self._grammars is None:
            self._grammars = Grammars.from_folder(
                self.model_folder,
                vocab_rows=self.model.config.vocab_size,
                eos_token_ids=request.eos_token_ids or self.eos_token_ids,
            )
        return self._grammars.matcher(guided, request.token_ids)

    def _new_sequence(self, request: PreprocessedRequest, budget: int) -> StepSequence:
        stop = request.stop_conditions
        eos = frozenset() if stop.ignore_eos else frozenset(request.eos_token_ids or self.eos_token_ids)
        return StepSequence(
            grammar=self._grammar(request),
            seq_id=next(self._ids),
            prompt=request.token_ids,
            budget=budget,
            sampling=request.sampling_options,
            eos=eos,
            min_tokens=stop.min_tokens,
            queue=asyncio.Queue(),
            generator=_make_generator(self.device, request.sampling_options.seed),
        )

    async def _stream(self, seq: StepSequence, context: Context | None) -> AsyncIterator[LLMEngineOutput]:
        """Run ``seq`` to its end, one output per token; it leaves the scheduler however it ends."""
        prompt_tokens = len(seq.prompt)
        sent = seq.generated  # tokens already out (a decode's first token); the scheduler may run ahead
        try:
            while True:
                token, finish = await self.scheduler.next_token(seq)
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
            self.scheduler.leave(seq)

    def _import_cache(self, header: dict[str, Any], payload: bytes) -> Any:
        """A DynamicCache from a received KV payload (runs in the engine's thread)."""
        from transformers import DynamicCache

        layers = unpack_kv(header, payload, expect=self._layout, device=self.device)
        model_dtype = next(self.model.parameters()).dtype
        layers = [(k.to(model_dtype), v.to(model_dtype)) for k, v in layers]
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    async def close(self) -> None:
        """Stop the scheduler and the bootstrap server, release the model thread."""
        await self.stop_bootstrap()
        await self.scheduler.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __repr__(self) -> str:
        name = type(self).__name__ if type(self) is HFEngine else f"{type(self).__name__}(HFEngine)"
        return f"<{name} {self.model.config.model_type} on {self.device}, {self.active} active>"


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
