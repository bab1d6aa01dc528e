"""The ``mocker`` engine: a simulated LLM engine for routing experiments at scale, no GPU, no model.

Its scheduler and timing model are `dynamo_nb.engines.mocker_scheduler`'s (vLLM-style chunked
prefill; Dynamo's polynomial step times, scaled by ``speedup_ratio`` and
``decode_speedup_ratio``); the engine runs them against the event loop's clock, and
`dynamo_nb.replay` runs the same on a simulated one.

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
import dataclasses
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..disagg.decode import fetch_prompt_kv
from ..disagg.prefill import BootstrapRole
from ..errors import DisaggregationError, EngineError
from ..llm.protocol import EmittingStream, LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context
from ..runtime.streams import closing
from ..settings import Settings, add_settings, at_least, nested, setting
from .base import KvEvent, KvEventSink, token_budget
from .kv_cache.blocks import KvBlockManager, publish_kv_events
from .mocker_scheduler import FLAG_GROUP, MockerScheduler, MockerSettings, MockJob, decode_ms, prefill_ms

logger = logging.getLogger("dynamo_nb.engines.mocker")

__all__ = ["MOCK_KV_FORMAT", "MockerEngine", "MockerWorkerSettings", "decode_ms", "prefill_ms"]

MOCK_KV_FORMAT = "dynamo_nb.mock-kv.v1"  # a prefill's handoff: no tensors, the prompt length and first token

# a pass sleeps until its deadline as Dynamo's lib/mocker/src/scheduler/vllm/live.rs
# @ 7568efc4c9497e42f0c6f018d79738ce4a1516e5.
MAX_CATCH_UP_S = 0.05
"""After a stall (no CPU for the event loop) at most this much lost time is made up by running
steps back to back; the rest is dropped, as a real engine cannot compute faster to catch up."""


@functools.lru_cache(maxsize=8)
def _special_token_ids(model_path: str) -> frozenset[int]:
    """The special token ids of ``model_path``'s tokenizer, read once per folder (a worker with
    ``--num-workers N`` builds N engines from one model)."""
    from ..llm.tokenizer import ModelTokenizer

    return frozenset(ModelTokenizer.load(model_path).special_token_ids())


class _Inbox:
    """One job's tokens (or its error) on their way from the engine loop to its stream: a
    deque and a future, a third of an ``asyncio.Queue``'s cost per token. It keeps its loop:
    ``asyncio.get_running_loop()`` is a ``getpid`` system call each time on Python 3.11."""

    __slots__ = ("items", "loop", "waiter")

    def __init__(self) -> None:
        self.items: deque[Any] = deque()
        self.loop: asyncio.AbstractEventLoop | None = None  # the first wait's
        self.waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        items = self.items
        while not items:
            if self.loop is None:
                self.loop = asyncio.get_running_loop()
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return items.popleft()


@dataclass(eq=False)
class _Request(MockJob):
    output: list[int] = field(default_factory=list)  # the ids it streams, cycled
    queue: _Inbox = field(default_factory=_Inbox)
    context: Context | None = None
    # an emitted stream's: where its outputs go (None once it ended), and its end
    emit: Callable[[dict[str, Any]], None] | None = None
    done: asyncio.Future[None] | None = None


class _Outputs(EmittingStream):
    """What `MockerEngine.generate` returns: its outputs as an async iterator, or sent from the
    engine's step by `emit_to` (an `EmittingStream`: what its worker does, no task woken per
    token). It queues the job at the first ``__anext__`` or ``emit_to``."""

    __slots__ = ("_context", "_engine", "_iterator", "_job")

    def __init__(self, engine: MockerEngine, job: _Request, context: Context | None) -> None:
        self._engine = engine
        self._job = job
        self._context = context
        self._iterator: AsyncGenerator[LLMEngineOutput, None] | None = None

    def __anext__(self) -> Awaitable[LLMEngineOutput]:
        if self._iterator is None:
            self._iterator = self._engine._stream(self._job, self._context)
        return self._iterator.__anext__()

    async def aclose(self) -> None:
        if self._iterator is not None:
            await self._iterator.aclose()

    async def emit_to(self, emit: Callable[[dict[str, Any]], None]) -> None:
        await self._engine._emit(self._job, self._context, emit)


@dataclass(frozen=True)
class MockerWorkerSettings(Settings):
    """Every flag of the mocker worker's own (see `dynamo_nb.settings`): how many engines it
    runs, each engine's `MockerSettings`, and the context length its model card publishes.

    Example:
        >>> MockerWorkerSettings(num_workers=0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: num_workers (--num-workers) must be at least 1, got 0
    """

    num_workers: int = setting(
        1,
        flag="--num-workers",
        group=FLAG_GROUP,
        check=at_least(1),
        help="engines in this process, each its own instance",
    )
    engine: MockerSettings = nested(MockerSettings)
    context_length: int | None = setting(
        None,
        flag="--context-length",
        group=FLAG_GROUP,
        check=at_least(1),
        default_text="the model folder's",
        help="longest prompt + output published in the model card",
    )


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
        planner_profile_data: str | None = None,
        kv_events: KvEventSink | None = None,
        skip_token_ids: frozenset[int] = frozenset(),
        context_length: int | None = None,
        kv_timeout: float = 30.0,
    ) -> None:
        settings = MockerSettings(
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            num_blocks=num_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            speedup_ratio=speedup_ratio,
            decode_speedup_ratio=decode_speedup_ratio,
            planner_profile_data=planner_profile_data,
        )
        self.scheduler = MockerScheduler(settings, on_token=self._deliver, on_reject=self._reject)
        self.block_size = block_size
        self.max_num_seqs: int | None = max_num_seqs
        self.context_length = context_length  # published in the card; the simulation refuses nothing
        self.kv_timeout = kv_timeout
        self.skip_token_ids = skip_token_ids
        self.kv_events = kv_events
        # a sink that hashes tokens itself (NVIDIA Dynamo's publisher) gets the blocks' tokens
        self.kv.event_token_ids = bool(getattr(kv_events, "wants_token_ids", False))
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def kv(self) -> KvBlockManager:
        """The scheduler's KV pool."""
        return self.scheduler.kv

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    @property
    def simulated_s(self) -> float:
        """The model's time of every step run, summed."""
        return self.scheduler.simulated_s

    @property
    def prefix_hits(self) -> int:
        return self.scheduler.prefix_hits

    @property
    def prompt_blocks(self) -> int:
        return self.scheduler.prompt_blocks

    @property
    def active(self) -> int:
        """Requests running or waiting."""
        return self.scheduler.active

    def stats(self) -> dict[str, int]:
        """Prefix cache hits: ``prefix_hits`` of ``prompt_blocks`` admitted prompt blocks were cached."""
        return {
            "prefix_hits": self.prefix_hits,
            "prompt_blocks": self.prompt_blocks,
            "cached_blocks": self.kv.used_blocks,
            "steps": self.steps,
        }

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add the flags `from_args` reads (the KV pool, scheduler limits, speed): an
        `dynamo_nb.EngineProgram` of this class or a subclass gets them."""
        add_settings(parser, MockerWorkerSettings)
        parser.set_defaults(max_num_seqs=MockerSettings.max_num_seqs)  # its own default, not 64

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
        own = MockerWorkerSettings.from_args(args)
        return cls(
            **dataclasses.asdict(own.engine),
            kv_events=kv_events,
            skip_token_ids=skip,
            context_length=own.context_length,
            kv_timeout=args.kv_timeout,
        )

    def kv_snapshot(self) -> list[KvEvent]:
        """Events that rebuild the KV pool's index from empty (for a KV router's re-sync)."""
        return self.kv.snapshot()

    def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]:
        """Exactly ``max_tokens`` tokens (default `DEFAULT_MAX_TOKENS`, 16), the last output with
        usage; an `EmittingStream`, so its worker has the engine's step send each token."""
        return _Outputs(self, _Request(request.token_ids, token_budget(request, None)), context)

    async def _prefill_handoff(
        self, request: PreprocessedRequest, context: Context | None
    ) -> tuple[dict[str, Any], bytes]:
        """The prefill role's work (see `BootstrapRole.prefill`): the prompt through the scheduler
        (its blocks cached here), then a tensor-less handoff."""
        job = _Request(request.token_ids, 1, handoff=True)
        async with closing(self._stream(job, context)) as outputs:
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
            yield self._final(job, [header["first_token"]], "length", completed=1)
            return
        yield LLMEngineOutput([header["first_token"]])
        async with closing(self._stream(job, context)) as items:
            async for item in items:
                yield item

    def _queue(self, job: _Request) -> None:
        job.output = [t for t in job.prompt if t not in self.skip_token_ids] or job.prompt or [0]
        self.scheduler.add(job)
        self._ensure_loop()

    async def _stream(self, job: _Request, context: Context | None) -> AsyncGenerator[LLMEngineOutput, None]:
        """Queue ``job`` and stream its tokens; leaving early (cancel, close) frees it."""
        self._queue(job)
        received = job.emitted  # a decode's first token came from its prefill
        try:
            while True:
                token = await job.queue.get()
                if isinstance(token, Exception):
                    raise token
                received += 1
                if received >= job.max_tokens:
                    yield self._final(job, [token], "length", received)
                    return
                yield LLMEngineOutput([token])
                if context is not None and context.is_stopped():
                    yield self._final(job, [], "cancelled", received)
                    return
        finally:
            self.scheduler.cancel(job)

    def _ensure_loop(self) -> None:
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="dynamo_nb-mocker")

    async def _run(self) -> None:
        """The engine's steps while jobs wait or run; if a step fails, every job's stream ends
        with that error (none is left waiting for a step that will not come)."""
        try:
            await self._steps()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception(
                "the mocker's step failed; its %d jobs end with the error", self.scheduler.active
            )
            self._fail_all(EngineError(f"the mocker's step failed: {type(exc).__name__}: {exc}"))
            # (logged once here; the next request starts a new loop)

    async def _steps(self) -> None:
        loop = asyncio.get_running_loop()
        scheduler = self.scheduler
        deadline: float | None = None  # when the current step ends, on the loop's clock
        while True:
            if not scheduler.busy:
                self._wake.clear()
                await self._wake.wait()
                deadline = None  # idle time is not owed to anyone
                continue
            chunks, step_s = scheduler.plan_step()
            now = loop.time()
            deadline = max(now if deadline is None else deadline, now - MAX_CATCH_UP_S) + step_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            scheduler.finish_step(chunks)
            await self._publish_events()

    def _fail_all(self, error: Exception) -> None:
        """End the stream of every job waiting or running with ``error``."""
        for job in self.scheduler.clear():  # (a stream that already left never reads its error)
            self._reject(job, error)

    async def _emit(
        self, job: _Request, context: Context | None, emit: Callable[[dict[str, Any]], None]
    ) -> None:
        """Queue ``job`` and wait until `_deliver` has sent its last output through ``emit``;
        leaving early (cancel) frees it."""
        job.context, job.emit = context, emit
        job.done = asyncio.get_running_loop().create_future()
        self._queue(job)
        try:
            await job.done
        finally:
            if job.emit is not None:  # left before its end (`_end` frees an ended one)
                job.emit = None
                self.scheduler.cancel(job)

    def _deliver(self, job: MockJob) -> None:
        """The scheduler gave ``job`` a token: stream the next of its ids (to its queue, or
        sent at once with its ``emit``: the outputs `_stream` would give)."""
        assert isinstance(job, _Request)
        token = job.output[(job.emitted - 1) % len(job.output)]
        emit = job.emit
        if emit is None:
            job.queue.put(token)
            return
        try:
            if job.emitted >= job.max_tokens:
                emit(self._final(job, [token], "length", job.emitted).to_dict())
            elif job.context is not None and job.context.is_stopped():
                emit({"token_ids": [token]})
                emit(self._final(job, [], "cancelled", job.emitted).to_dict())
            else:
                emit({"token_ids": [token]})
                return
            self._end(job, None)
        except Exception as exc:  # (e.g. its plane could not encode it): that stream fails alone
            self._end(job, exc)

    @staticmethod
    def _final(job: _Request, tokens: list[int], reason: str, completed: int) -> LLMEngineOutput:
        """``job``'s last output: ``tokens``, why it ended, usage with ``completed`` tokens."""
        return LLMEngineOutput.final(
            tokens, reason, prompt_tokens=len(job.prompt), completion_tokens=completed,
            cached_tokens=job.cached_tokens,
        )  # fmt: skip

    def _end(self, job: _Request, error: Exception | None) -> None:
        """An emitted stream is over: nothing more is sent, and `_emit` returns (or raises ``error``)."""
        job.emit = None
        self.scheduler.cancel(job)
        if job.done is not None and not job.done.done():
            if error is None:
                job.done.set_result(None)
            else:
                job.done.set_exception(error)

    def _reject(self, job: MockJob, error: Exception) -> None:
        """The scheduler can never run ``job``: its stream raises ``error``."""
        assert isinstance(job, _Request)
        if job.emit is None:
            job.queue.put(error)
        else:
            self._end(job, error)

    async def _publish_events(self) -> None:
        await publish_kv_events(self.kv_events, self.kv.drain_events())

    async def close(self) -> None:
        """Stop the engine: the streams still running end with an `EngineError` that says so."""
        await self.stop_bootstrap()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail_all(EngineError("the mocker engine was closed while this request ran"))

    def __repr__(self) -> str:
        return f"<MockerEngine block_size={self.block_size} {self.active} active, {self.kv.used_blocks} blocks cached>"
