"""Replay a trace offline, in virtual time: the real routers and the mocker's scheduler on a
simulated clock.

Each worker is a `MockerScheduler` (the scheduler and timing model a live mocker worker runs);
each pool is routed by the router the frontend would build (`RoundRobinRouter`,
`RandomRouter`, `LeastLoadedRouter`, `KvRouter` with its radix tree fed by the workers' own KV
events), told of first tokens and ends as the frontend tells it. Nothing sleeps and nothing is
sent: the clock jumps from one event (an arrival, the end of a worker's step, a handoff) to the
next, so minutes of traffic replay in about a second.

The result has the columns of `dynamo_nb.bench.run` (one row per request, times in seconds
from the trace's start), so `bench.summary`, `bench.slo_attainment` and the charts read it as
they read a live run.

Example:
    >>> from dynamo_nb.bench import synthetic_trace
    >>> trace = synthetic_trace(200, rate=20.0, prefix_groups=4, prefix_blocks=8, seed=1)
    >>> result = replay(trace, Fleet(workers=2, router="kv"), seed=0)
    >>> len(result.requests), int(result.requests["error"].notna().sum())
    (200, 0)
    >>> replay(trace, Fleet(workers=2), seed=0).requests["ttft_s"].equals(result.requests["ttft_s"])
    True
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engines.mocker_scheduler import MockerScheduler, MockJob
from ..errors import ConfigError
from ..llm.protocol import PreprocessedRequest
from ..router import Route, Router, build_router
from ..router.kv import KvRouter, KvRouterConfig
from ..router.kv.indexer import RadixTree
from .fleet import Fleet, MockerSettings
from .trace_blocks import TraceBlocks

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ReplayResult", "replay"]

_REQUEST = PreprocessedRequest(token_ids=[])  # what routers that ignore the prompt are shown


@dataclass
class ReplayResult:
    """A replay's requests (the columns of `bench.run`) and what it took.

    Attributes:
        requests: one row per request, in arrival order.
        fleet, settings: what ran.
        virtual_s: simulated seconds, first arrival to last answer.
        wall_s: seconds the replay took here.
        steps: engine steps simulated.
        busy_s: the engines' simulated time ``prefill`` (computing prompts) and ``decode``
            (producing tokens), summed over workers.
    """

    requests: pd.DataFrame
    fleet: Fleet
    settings: MockerSettings
    virtual_s: float
    wall_s: float
    steps: int
    busy_s: dict[str, float] = field(default_factory=dict)

    @property
    def speed(self) -> float:
        """Simulated seconds per wall-clock second."""
        return self.virtual_s / self.wall_s if self.wall_s > 0 else math.inf

    def __repr__(self) -> str:
        return (
            f"<ReplayResult {len(self.requests)} requests on {self.fleet.describe()}: "
            f"{self.virtual_s:.1f} s simulated in {self.wall_s:.2f} s ({self.speed:.0f}×)>"
        )


class _PoolClient:
    """What a router asks of its endpoint's client (a `RoutingClient`), for a simulated pool of
    instances: the replay's routers only pick, the simulation runs what they picked."""

    def __init__(self, name: str, instance_ids: list[int], rng: random.Random) -> None:
        self.endpoint = _Endpoint(name, name.rsplit(".", 1)[-1])
        self._ids = instance_ids
        self._rng = rng
        self._next = 0

    def instance_ids(self) -> list[int]:
        return list(self._ids)

    available_ids = instance_ids

    def down_ids(self) -> list[int]:
        return []

    suspect_ids = down_ids

    def next_instance(self) -> int:
        chosen = self._ids[self._next % len(self._ids)]
        self._next += 1
        return chosen

    def random_instance(self) -> int:
        return self._rng.choice(self._ids)

    def direct(self, request: Any, instance_id: int, *, context: Any = None) -> Any:
        raise ConfigError("a replay's routers only pick: the simulation runs the request, nothing is sent")

    async def wait_for_instances(self, timeout: float = 30.0) -> list[int]:
        return self.instance_ids()


@dataclass(frozen=True)
class _Endpoint:
    path: str
    name: str


@dataclass(eq=False)
class _Request:
    """One replayed request: its row, and what its worker and routers must hear of it."""

    row: dict[str, Any]
    route: Route  # aggregated, or the decode's (routed as it arrives)
    prefill_route: Route | None = None
    times: list[float] = field(default_factory=list)
    decode: MockJob | None = None  # the decode job that waits for the prefill's handoff


class _Worker:
    def __init__(self, instance_id: int, scheduler: MockerScheduler, pool: _Pool) -> None:
        self.instance_id = instance_id
        self.scheduler = scheduler
        self.pool = pool
        self.stepping = False


class _Pool:
    def __init__(self, router: Router, tree: RadixTree | None) -> None:
        self.router = router
        self.tree = tree
        self.workers: dict[int, _Worker] = {}


class _Simulation:
    def __init__(self, fleet: Fleet, settings: MockerSettings, seed: int, trace_block_size: int) -> None:
        self.fleet = fleet
        self.settings = settings
        self.now = 0.0
        self.rng = random.Random(seed)
        self.blocks = TraceBlocks(trace_block_size, settings.block_size)
        self._events: list[tuple[float, int, int, Any]] = []  # (time, order, kind, what)
        self._order = 0
        self._waiting: collections.deque[Any] = collections.deque()  # closed loop: not yet sent
        self.rows: list[dict[str, Any]] = []
        next_id = iter(range(1, 1 << 30))
        if fleet.disaggregated:
            self.prefill: _Pool | None = self._pool("prefill", fleet.prefill, next_id, handoff=True)
            self.decode = self._pool("decode", fleet.decode, next_id, handoff=False)
        else:
            self.prefill = None
            self.decode = self._pool("backend", fleet.workers, next_id, handoff=False)

    def _pool(self, name: str, count: int, next_id: Any, *, handoff: bool) -> _Pool:
        ids = [next(next_id) for _ in range(count)]
        client = _PoolClient(f"dynamo.{name}.generate", ids, random.Random(self.rng.random()))
        mode = self.fleet.router
        tree = RadixTree(clock=lambda: self.now) if mode == "kv" else None
        limit = self.settings.max_num_seqs
        router = build_router(
            mode,
            client,
            block_size=self.settings.block_size,
            kv_config=KvRouterConfig(policy=self.fleet.router_policy),
            limit_of=lambda _instance: limit,
            rng=random.Random(self.rng.random()) if mode in ("kv", "least-loaded") else None,
            tree=tree,
        )
        pool = _Pool(router, tree)
        for instance_id in ids:
            scheduler = MockerScheduler(
                self.settings,
                on_token=self._on_prefilled if handoff else self._on_token,
                on_reject=self._on_reject,
            )
            pool.workers[instance_id] = _Worker(instance_id, scheduler, pool)
        return pool

    # -- events

    def _at(self, when: float, kind: int, what: Any) -> None:
        self._order += 1
        heapq.heappush(self._events, (when, self._order, kind, what))

    def run(
        self,
        arrivals: list[tuple[float, dict[str, Any], list[int], list[int]]],
        concurrency: int | None = None,
    ) -> None:
        """Play ``arrivals`` at their times (open loop), or with ``concurrency`` requests in
        flight, each sent as one before it finishes (closed loop: the first ones at 0 s)."""
        events = self._events
        if concurrency is not None:
            self._waiting.extend(arrivals)
            for _ in range(min(concurrency, len(arrivals))):
                self._at(0.0, 2, self._waiting.popleft())
            arrivals = []
        index = 0
        while index < len(arrivals) or events:
            if index < len(arrivals) and (not events or arrivals[index][0] <= events[0][0]):
                when, row, local, sequence = arrivals[index]
                index += 1
                self.now = when
                self._arrive(row, local, sequence)
                continue
            when, _, kind, what = heapq.heappop(events)
            self.now = when
            if kind == 0:
                self._step_ended(what)
            elif kind == 2:  # closed loop: sent now
                _, row, local, sequence = what
                row["sent_s"] = when
                self._arrive(row, local, sequence)
            else:
                worker, job = what
                self._enqueue(worker, job)

    def _route(self, pool: _Pool, local: list[int], sequence: list[int], prompt_tokens: int) -> Route:
        router = pool.router
        if isinstance(router, KvRouter):
            return router.choose_blocks(local, sequence, prompt_tokens)
        return router.pick(_REQUEST)

    def _arrive(self, row: dict[str, Any], local: list[int], sequence: list[int]) -> None:
        prompt_tokens = row["input_tokens"]
        prefill = self.prefill
        prefill_route = self._route(prefill, local, sequence, prompt_tokens) if prefill is not None else None
        request = _Request(row, self._route(self.decode, local, sequence, prompt_tokens), prefill_route)
        if prefill is not None and prefill_route is not None:  # the decode routed at once: the fast path
            row["prefill_worker"] = f"{prefill_route.instance_id:x}"
            row["path"] = "fast"
            job = MockJob(max_tokens=1, prompt_len=prompt_tokens, hashes=(local, sequence), handoff=True)
            job.owner = request
            request.decode = MockJob(
                max_tokens=row["output_tokens"], prompt_len=prompt_tokens, hashes=(local, sequence),
                emitted=1, transferred=True, owner=request,
            )  # fmt: skip
            self._enqueue(prefill.workers[prefill_route.instance_id], job)
        else:
            row["path"] = "aggregated"
            job = MockJob(max_tokens=row["output_tokens"], prompt_len=prompt_tokens, hashes=(local, sequence))
            job.owner = request
            self._enqueue(self.decode.workers[request.route.instance_id], job)
        row["worker"] = f"{request.route.instance_id:x}"

    def _enqueue(self, worker: _Worker, job: MockJob) -> None:
        worker.scheduler.add(job)
        if not worker.stepping:
            self._start_step(worker)

    def _start_step(self, worker: _Worker) -> None:
        chunks, seconds = worker.scheduler.plan_step()
        worker.stepping = True
        self._at(self.now + seconds, 0, (worker, chunks))

    def _step_ended(self, what: tuple[_Worker, list[tuple[MockJob, int]]]) -> None:
        worker, chunks = what
        scheduler = worker.scheduler
        scheduler.finish_step(chunks)
        tree = worker.pool.tree
        if tree is not None:
            for event in scheduler.kv.drain_events():
                tree.apply_event(worker.instance_id, event)
        else:
            scheduler.kv.drain_events()
        if scheduler.busy:
            self._start_step(worker)
        else:
            worker.stepping = False

    # -- what the schedulers report

    def _on_token(self, job: MockJob) -> None:
        request: _Request = job.owner
        request.times.append(self.now)
        if job.emitted == 1:  # (a decode's first token was its prefill's)
            self.decode.router.first_token(request.route)
            request.row["cached_tokens"] = job.cached_tokens
        if job.emitted >= job.max_tokens:
            self.decode.router.finished(request.route)
            self._done(request)

    def _on_prefilled(self, job: MockJob) -> None:
        """A prefill finished: its first token is the request's; the decode starts after the transfer."""
        request: _Request = job.owner
        assert self.prefill is not None and request.prefill_route is not None and request.decode is not None
        self.prefill.router.first_token(request.prefill_route)
        self.prefill.router.finished(request.prefill_route)
        request.times.append(self.now)
        request.row["cached_tokens"] = job.cached_tokens
        self.decode.router.first_token(request.route)
        if request.decode.max_tokens <= 1:  # the decode answers with the prefill's token at once
            self.decode.router.finished(request.route)
            self._done(request)
            return
        handed = self.now + self.fleet.transfer_ms / 1000.0
        self._at(handed, 1, (self.decode.workers[request.route.instance_id], request.decode))

    def _on_reject(self, job: MockJob, error: Exception) -> None:
        request: _Request = job.owner
        request.row["error"] = str(error)
        request.row["status"] = 400
        for pool, route in ((self.prefill, request.prefill_route), (self.decode, request.route)):
            if pool is not None and route is not None:
                pool.router.finished(route)
        self._done(request)

    def _done(self, request: _Request) -> None:
        row, times = request.row, request.times
        overhead = self.fleet.overhead_ms / 1000.0  # between the client and the engines, as measured
        row["e2e_s"] = self.now - row["sent_s"] + overhead
        if times:
            row["ttft_s"] = times[0] - row["sent_s"] + overhead
            row["itl_s"] = [b - a for a, b in itertools.pairwise(times)]
        if row["error"] is None:
            row["output_tokens"] = len(times)
        self.rows.append(row)
        if self._waiting:  # closed loop: the next request takes its place
            self._at(self.now, 2, self._waiting.popleft())

    def schedulers(self) -> list[MockerScheduler]:
        pools = [self.decode] + ([self.prefill] if self.prefill is not None else [])
        return [worker.scheduler for pool in pools for worker in pool.workers.values()]


def replay(
    trace: pd.DataFrame,
    fleet: Fleet | None = None,
    settings: MockerSettings | None = None,
    *,
    seed: int = 0,
    label: str = "",
    concurrency: int | None = None,
) -> ReplayResult:
    """Replay ``trace`` (`bench.read_trace` / `synthetic_trace` columns) on ``fleet`` of mocker
    engines with ``settings``, in virtual time (see the module docstring).

    With ``concurrency`` the trace's times are ignored and its requests are sent in order with
    that many in flight (a closed loop, as a benchmark's fixed concurrency): each one as the one
    before it finishes. The same trace, fleet, settings and ``seed`` (the routers' draws) give
    the same result.

    Example::

        result = replay(bench.read_trace("trace.jsonl"), Fleet(workers=4, router="kv"))
        bench.summary(result.requests)
    """
    from ..bench.http_client import RECORD_COLUMNS
    from ..bench.records import records_frame
    from ..bench.traces import in_arrival_order

    fleet = fleet or Fleet()
    settings = settings or MockerSettings()
    missing = [c for c in ("timestamp_ms", "input_length", "output_length", "hash_ids") if c not in trace]
    if missing:
        raise ConfigError(f"the trace has no {', '.join(missing)} column: read it with bench.read_trace")
    started = time.perf_counter()
    simulation = _Simulation(fleet, settings, seed, int(trace.attrs.get("block_size", 64)))
    order, origin, offered = in_arrival_order(trace)
    arrivals = []
    for index, (at_ms, inputs, outputs, ids) in enumerate(
        zip(
            order["timestamp_ms"],
            order["input_length"],
            order["output_length"],
            order["hash_ids"],
            strict=True,
        )
    ):
        row = dict.fromkeys(RECORD_COLUMNS)
        sent = (float(at_ms) - origin) / 1000.0
        row.update(label=label, rate=offered, index=index, sent_s=sent, input_tokens=int(inputs),
                   output_tokens=max(int(outputs), 1), status=200, request_id=f"replay-{index}")  # fmt: skip
        local, sequence = simulation.blocks.hashes(ids, int(inputs))
        arrivals.append((sent, row, local, sequence))
    if concurrency is not None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1 request in flight, got {concurrency}")
        for _, row, _, _ in arrivals:
            row["concurrency"], row["rate"] = concurrency, None
    simulation.run(arrivals, concurrency)
    rows = sorted(simulation.rows, key=lambda r: r["index"])
    frame = records_frame(rows)
    ends = [r["sent_s"] + r["e2e_s"] for r in rows]
    virtual = max(ends) - min(r["sent_s"] for r in rows) if rows else 0.0
    schedulers = simulation.schedulers()
    busy = {"prefill": sum(s.prefill_s for s in schedulers), "decode": sum(s.decode_s for s in schedulers)}
    steps = sum(s.steps for s in schedulers)
    return ReplayResult(frame, fleet, settings, virtual, time.perf_counter() - started, steps, busy)
