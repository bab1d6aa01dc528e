"""The mocker's scheduler and timing model, with no clock of its own: what one engine step does
and how long it lasts.

`MockerEngine` runs it against the event loop's clock (it sleeps each step's time), and
`dynamo_nb.replay` runs it on a simulated clock (it jumps to each step's end), so a trace
replayed offline goes through exactly the scheduler and timing model a live mocker worker has.

A step (vLLM-style, chunked prefill): every prefilled running job gets one decode token, the
rest of the token budget (``max_num_batched_tokens``) goes to prompt chunks of running
prefills, then waiting jobs are admitted (while ``max_num_seqs`` and the KV pool allow) with
chunks of their uncached prompt tokens. A job's first token comes at the end of the step that
finishes its prompt. A step lasts what its timing model says (`dynamo_nb.engines.mocker_timing`:
by default Dynamo's mocker's polynomial curves, in milliseconds; with ``planner_profile_data``,
a model fitted to an engine measured by `dynamo_nb.bench.profile`):

- prefill: ``4.209989e-7·T² + 1.518344e-2·T + 16.50142`` for T uncached prompt tokens in the
  step (0 when everything was cached; Dynamo's count of a step's chunks), divided by
  ``speedup_ratio`` (a profiled model charges each prompt its own curve instead:
  `ProfiledTiming.step_prefill_ms`);
- decode, when some job has a token to emit at the end of the step (including those whose
  prompt the step finishes; a prefill worker's handoffs do not count):
  ``max(-25.74·p² + 54.01·p + 5.74, 1)`` with p = KV tokens held by running jobs (their
  prompts and the tokens decoded so far, in whole blocks) / total KV tokens, divided by
  ``speedup_ratio · decode_speedup_ratio``.

Example (a 40-token prompt, 4 tokens out, on a simulated clock):
    >>> scheduler = MockerScheduler(MockerSettings(block_size=16))
    >>> scheduler.add(MockJob(prompt=list(range(40)), max_tokens=4))
    >>> clock, steps = 0.0, 0
    >>> while scheduler.busy:
    ...     chunks, seconds = scheduler.plan_step()
    ...     clock += seconds
    ...     scheduler.finish_step(chunks)
    ...     steps += 1
    >>> steps, round(clock * 1000, 1)   # a prefill step (with its first token), then 3 decode steps
    (4, 40.1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidRequestError
from ..settings import at_least, greater_than, redefault, setting
from .base import EngineLimits
from .kv_cache.blocks import Allocation, KvBlockManager
from .mocker_timing import PolynomialTiming, TimingModel, timing_model

__all__ = ["MockJob", "MockerScheduler", "MockerSettings", "decode_ms", "prefill_ms"]

FLAG_GROUP = "mocker engine"

# The timing model follows Dynamo's mocker: ai-dynamo/dynamo lib/mocker/src/common/perf_model.rs
# (PerfModel::Polynomial) and lib/mocker/src/scheduler/vllm/core.rs (the pass's prefill tokens,
# its ready requests, the decode load) @ f80944a4c0c32d6e8ba9ab7a58a399eae18a053a.


def prefill_ms(uncached_tokens: int) -> float:
    """Dynamo's polynomial prefill time for ``uncached_tokens`` new prompt tokens in a step."""
    return _DYNAMOS_CURVES.prefill_ms(uncached_tokens)


def decode_ms(kv_load: float) -> float:
    """Dynamo's polynomial decode step time at ``kv_load`` = active KV tokens / total (floor 1 ms)."""
    return _DYNAMOS_CURVES.decode_ms(batch=0, kv_tokens=0, kv_load=kv_load)


_DYNAMOS_CURVES = PolynomialTiming()


@dataclass(frozen=True)
class MockerSettings(EngineLimits):
    """The scheduler and timing flags of the mocker worker (components/mocker_worker.py), each
    declared on its field with its default (see `dynamo_nb.settings`); the block size and the
    running-request limit are every engine worker's (`EngineLimits`), the limit 256 here as in
    Dynamo's mocker. `argv` gives them back as the worker's command line.

    Example:
        >>> MockerSettings(speedup_ratio=5).argv()[-4:]
        ['--speedup-ratio', '5', '--decode-speedup-ratio', '1']
        >>> MockerSettings(speedup_ratio=0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: speedup_ratio (--speedup-ratio) must be more than 0, got 0
    """

    max_num_seqs: int = redefault(EngineLimits, "max_num_seqs", 256)
    num_blocks: int = setting(
        16384, flag="--num-gpu-blocks", group=FLAG_GROUP, check=at_least(1), help="KV blocks per engine"
    )
    max_num_batched_tokens: int = setting(
        8192,
        flag="--max-num-batched-tokens",
        group=FLAG_GROUP,
        check=at_least(1),
        help="token budget of a step",
    )
    speedup_ratio: float = setting(
        1.0,
        flag="--speedup-ratio",
        group=FLAG_GROUP,
        check=greater_than(0),
        help="divide every simulated step time by this",
    )
    decode_speedup_ratio: float = setting(
        1.0,
        flag="--decode-speedup-ratio",
        group=FLAG_GROUP,
        check=greater_than(0),
        help="divide the decode part of a step time by this too, as Dynamo's mocker",
    )
    planner_profile_data: str | None = setting(
        None,
        flag="--planner-profile-data",
        group=FLAG_GROUP,
        default_text="none: Dynamo's built-in curves",
        help="a profile-data folder (Dynamo's layout, as bench.profile or Dynamo's profiler writes it): step "
        "times fitted to the engine measured there",
    )

    def scaled(self, speedup: float) -> MockerSettings:
        """The same engines ``speedup`` times faster (for a live run of a time-compressed trace)."""
        return replace(self, speedup_ratio=self.speedup_ratio * speedup)


@dataclass(eq=False)
class MockJob:
    """One request inside a mocker engine.

    Attributes:
        prompt: its token ids (only hashed into blocks; a replay gives ``prompt_len`` and
            ``hashes`` instead).
        max_tokens: tokens it produces in all (a decode's first came from its prefill: ``emitted`` 1).
        prompt_len: prompt tokens (default ``len(prompt)``).
        hashes: the prompt's (local, sequence) block hashes, computed at admission when None.
        computed: prompt tokens whose KV exists (cached prefix, then prefill chunks).
        cached_tokens: prompt tokens found in the prefix cache at admission.
        emitted: tokens produced so far.
        cancelled: it left (the engine frees it at the next step).
        transferred: a decode: its prompt's KV came from a prefill worker, nothing to prefill.
        handoff: a prefill worker's job: its one token is part of the prefill pass.
        owner: whatever its runner keeps with it (the live engine's queue, a replay's record).
    """

    prompt: list[int] = field(default_factory=list)
    max_tokens: int = 16
    prompt_len: int = -1
    hashes: tuple[list[int], list[int]] | None = None
    allocation: Allocation | None = None
    computed: int = 0
    cached_tokens: int = 0
    emitted: int = 0
    cancelled: bool = False
    transferred: bool = False
    handoff: bool = False
    owner: Any = None

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            self.prompt_len = len(self.prompt)

    @property
    def prefilled(self) -> bool:
        return self.computed >= self.prompt_len


class MockerScheduler:
    """See the module docstring.

    Attributes:
        kv: the `KvBlockManager` (its KV events are drained by the runner).
        prefix_hits, prompt_blocks: cached and total prompt blocks of admitted jobs.
        steps: steps finished; ``simulated_s``: the model's time of every step planned, summed,
            of which ``prefill_s`` computing prompts and ``decode_s`` producing tokens.
        on_token: called with each job that got a token at the end of a step (after ``emitted``
            counts it).
        on_reject: called with a job that can never fit the KV pool and the error for it.
    """

    def __init__(
        self,
        settings: MockerSettings | None = None,
        *,
        on_token: Callable[[MockJob], None] | None = None,
        on_reject: Callable[[MockJob, Exception], None] | None = None,
    ) -> None:
        settings = settings or MockerSettings()
        self.settings = settings
        self.kv = KvBlockManager(settings.num_blocks, settings.block_size)
        self.block_size = settings.block_size
        self.max_num_batched_tokens = settings.max_num_batched_tokens
        self.max_num_seqs = settings.max_num_seqs
        self.speedup_ratio = settings.speedup_ratio
        self.decode_speedup_ratio = settings.decode_speedup_ratio
        self.timing: TimingModel = timing_model(settings.planner_profile_data)
        self.on_token = on_token or (lambda job: None)
        self.on_reject = on_reject or (lambda job, error: None)
        self.prefix_hits = 0
        self.prompt_blocks = 0
        self.steps = 0
        self.simulated_s = 0.0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.waiting: deque[MockJob] = deque()
        self.running: list[MockJob] = []

    @property
    def busy(self) -> bool:
        """Whether any job is running or waiting."""
        return bool(self.waiting or self.running)

    @property
    def active(self) -> int:
        """Jobs running or waiting."""
        return len(self.running) + len(self.waiting)

    def add(self, job: MockJob) -> None:
        """Queue ``job``; the next step may admit it."""
        self.waiting.append(job)

    def cancel(self, job: MockJob) -> None:
        """``job`` left: it leaves the queue now, or the running batch at the next step's end."""
        job.cancelled = True
        if job in self.waiting:  # (a deque's remove of a missing job formats its repr)
            self.waiting.remove(job)

    def clear(self) -> list[MockJob]:
        """Every job waiting or running leaves at once, its blocks freed (the engine stopped);
        returns them."""
        jobs = [*self.waiting, *self.running]
        for job in jobs:
            job.cancelled = True
            if job.allocation is not None:
                self.kv.release(job.allocation)
                job.allocation = None
        self.waiting.clear()
        self.running = []
        return jobs

    def plan_step(self) -> tuple[list[tuple[MockJob, int]], float]:
        """The next step: its prefill chunks (admitting waiting jobs) and how long it lasts, in seconds."""
        decoding = sum(1 for job in self.running if job.prefilled and not job.cancelled)
        chunks = self._schedule(self.max_num_batched_tokens - decoding)
        prefill, decode = self.step_parts(chunks)
        self.prefill_s += prefill
        self.decode_s += decode
        self.simulated_s += prefill + decode
        return chunks, prefill + decode

    def finish_step(self, chunks: list[tuple[MockJob, int]]) -> None:
        """The step ``chunks`` came from is over: its prompt chunks are computed (their blocks
        cached), every prefilled running job gets a token (`on_token`), and finished and
        cancelled jobs leave, freeing their blocks."""
        self.steps += 1
        kv = self.kv
        for job, tokens in chunks:
            job.computed += tokens
            if job.allocation is not None:
                kv.mark_computed(job.allocation, job.computed)
        on_token = self.on_token
        still = []
        for job in self.running:
            if not job.cancelled and job.computed >= job.prompt_len and job.emitted < job.max_tokens:
                job.emitted += 1
                on_token(job)
            if job.cancelled or job.emitted >= job.max_tokens:
                if job.allocation is not None:
                    kv.release(job.allocation)
                    job.allocation = None
            else:
                still.append(job)
        self.running = still

    def step_parts(self, chunks: list[tuple[MockJob, int]]) -> tuple[float, float]:
        """A step's prefill and decode seconds (the timing model's, scaled)."""
        prefill = self.timing.step_prefill_ms([(job.computed, tokens) for job, tokens in chunks])
        chunk_of = {id(job): tokens for job, tokens in chunks}
        ready = kv_tokens = 0  # the jobs with a token at the end of this step, and their context
        for job in self.running:
            if (
                not job.cancelled
                and not job.handoff
                and job.emitted < job.max_tokens
                and job.computed + chunk_of.get(id(job), 0) >= job.prompt_len  # computed once this step ends
            ):
                ready += 1
                kv_tokens += job.prompt_len + job.emitted
        decode = 0.0
        if ready:
            decode = self.timing.decode_ms(batch=ready, kv_tokens=kv_tokens, kv_load=self.kv_load())
            decode /= self.decode_speedup_ratio
        scale = 1000.0 * self.speedup_ratio
        return prefill / scale, decode / scale

    def kv_load(self) -> float:
        """KV tokens held by running jobs (shared prompt blocks once, plus each job's partial and
        decoded blocks) over the pool's tokens."""
        size = self.block_size
        extra = 0
        for job in self.running:
            if not job.cancelled:
                extra += -(-(job.prompt_len + job.emitted) // size) - job.prompt_len // size
        return min(1.0, (self.kv.active_blocks + extra) / self.kv.num_blocks)

    def _schedule(self, budget: int) -> list[tuple[MockJob, int]]:
        """This step's prefill chunks within ``budget`` tokens: running prefills first (chunked
        prefill), then newly admitted jobs while ``max_num_seqs`` and the KV pool allow."""
        chunks: list[tuple[MockJob, int]] = []
        for job in self.running:
            if budget <= 0:
                return chunks
            if not job.prefilled and not job.cancelled:
                tokens = min(job.prompt_len - job.computed, budget)
                chunks.append((job, tokens))
                budget -= tokens
        kv = self.kv
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            job = self.waiting[0]
            if job.cancelled:
                self.waiting.popleft()
                continue
            if job.hashes is None:
                job.hashes = kv.hashes(job.prompt)
            if not kv.can_allocate(job.prompt, job.hashes):
                if not self.running:  # an empty pool is too small: it never fits
                    self.waiting.popleft()
                    self.on_reject(
                        job,
                        InvalidRequestError(
                            f"the prompt needs {job.prompt_len // self.block_size} KV blocks and the "
                            f"mocker's pool has {kv.num_blocks}: raise --num-gpu-blocks or shorten it",
                            param="messages",
                        ),
                    )
                    continue
                break
            self.waiting.popleft()
            job.allocation = kv.allocate(job.prompt, job.hashes)
            self.running.append(job)
            if job.transferred:  # its KV arrived whole: the blocks are computed, nothing to prefill
                job.computed = job.prompt_len
                kv.mark_computed(job.allocation, job.computed)
                continue
            job.computed = min(job.allocation.cached_blocks * self.block_size, job.prompt_len)
            job.cached_tokens = job.computed
            self.prefix_hits += job.allocation.cached_blocks
            self.prompt_blocks += len(job.allocation.sequence)
            tokens = min(job.prompt_len - job.computed, budget)
            chunks.append((job, tokens))
            budget -= tokens
        return chunks
