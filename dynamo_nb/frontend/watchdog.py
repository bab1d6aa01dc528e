"""The hung-worker watchdog: a worker that stops sending (a stuck kernel, a deadlocked engine, a
frozen host) while its lease and connection still hold is noticed in about a second, its
streams move to another worker (the kit's migration, with the tokens so far), and it gets no new
requests until a canary answers.

A worker is judged as a whole, not stream by stream: a request waiting in a busy engine's
queue is not a hang while the engine sends tokens for others. For every worker it has streams
on, the frontend keeps when it last heard from it and what it expects: the worker's recent step
time (the gaps between its tokens) plus the longest prompt it has not answered yet, at the
worker's measured time per prompt token (first token over prompt length: conservative for long
prompts, whose fixed cost is shared). A worker silent for longer than ``--hang-factor`` times that, and
at least ``--hang-after`` seconds, is **suspect**: logged, counted
(``dynamo_frontend_hung_instances_total``), listed in ``/health`` and in the routing decisions that
avoided it, and its streams are handed to the others (`ResponseStream.give_up`). Slow but alive
is not a hang: a worker slowed down has longer gaps and first tokens, so its expectation grows
with it; a silence is counted only while the frontend's own loop was running (a frontend that
stalled blames no worker). With no other worker to move to, its streams wait, as before.

A suspect worker is sent a canary every ``--canary-interval`` seconds: a one-token request over
the request plane, straight to it (as Dynamo's health check canary). The first answer, or any
token it sends again, clears it; a worker that leaves discovery is forgotten.

Example::

    watchdog = StreamWatchdog(WatchdogConfig(), models.suspects, metrics)
    watchdog.start()                                   # the sweep, on the running loop
    watch = watchdog.watch(model, stream, len(request.token_ids), decision)
    first = await stream.__anext__(); watch.item(time.perf_counter())
    ...                                                # every item: watch.item(now, gap)
    watch.close()                                      # the stream ended
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InstanceDownError, RemoteHandlerError, RequestError
from ..llm.protocol import PreprocessedRequest, StopConditions
from ..router.decision import RoutingDecision
from ..runtime.context import Context
from ..runtime.ids import new_request_id
from ..runtime.suspects import SuspectInstances, Suspicion
from ..settings import Settings, at_least, greater_than, setting

if TYPE_CHECKING:
    from ..router.base import RoutedStream
    from ..runtime.client import Client, ResponseStream
    from .metrics import FrontendMetrics
    from .served_models import ServedModel

__all__ = ["NO_WATCH", "StreamWatch", "StreamWatchdog", "WatchdogConfig", "tokens_to_compute"]

logger = logging.getLogger("dynamo_nb.frontend")

_GROUP = "hung workers"
STEP_PRIOR_S = 0.05  # a worker not heard from yet: a step and a prompt token cost this much
TOKEN_PRIOR_S = 0.001
_SMOOTHING = 0.2  # weight of the newest observation in a worker's running estimates


@dataclass(frozen=True)
class WatchdogConfig(Settings):
    """When a silent worker counts as hung, and how it is asked whether it is back.

    Example:
        >>> WatchdogConfig(hang_after=0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: hang_after (--hang-after) must be more than 0 seconds, got 0
    """

    enabled: bool = setting(
        True,
        flag="--no-hang-watchdog",
        negate=True,
        group=_GROUP,
        default_text="on",
        help="do not watch for workers that hang (then a frozen worker's streams wait for its "
        "connection's heartbeat to lapse, 5 s, or its lease)",
    )
    hang_after: float = setting(
        1.0,
        flag="--hang-after",
        group=_GROUP,
        check=greater_than(0, "seconds"),
        help="seconds of silence at least before a worker with streams in flight counts as hung "
        "(its streams then move, and it gets no new requests until a canary answers)",
    )
    hang_factor: float = setting(
        8.0,
        flag="--hang-factor",
        group=_GROUP,
        check=at_least(1),
        help="a worker counts as hung when it is silent this many times longer than expected: its "
        "recent step time plus its unanswered prompts at its measured time per prompt token",
    )
    canary_interval: float = setting(
        0.5,
        flag="--canary-interval",
        group=_GROUP,
        check=greater_than(0, "seconds"),
        help="seconds between canaries (a one-token request) to a worker suspected of hanging",
    )
    canary_timeout: float = setting(
        2.0,
        flag="--canary-timeout",
        group=_GROUP,
        check=greater_than(0, "seconds"),
        help="seconds a canary waits for its token",
    )


class _Worker:
    """What the frontend knows of one worker instance's progress."""

    __slots__ = ("canary", "client", "instance_id", "last", "model", "open", "step_s", "suspect", "token_s")

    def __init__(self, instance_id: int, client: Client, model: ServedModel, now: float) -> None:
        self.instance_id = instance_id
        self.client = client
        self.model = model
        self.open: dict[StreamWatch, None] = {}  # the streams in flight on it (an ordered set)
        self.last = now  # when it last sent an item (or got work while idle)
        self.step_s = STEP_PRIOR_S  # its recent gap between two tokens of a stream
        self.token_s = TOKEN_PRIOR_S  # its recent first-token time per prompt token
        self.suspect = False
        self.canary: asyncio.Task[None] | None = None

    def expected_s(self) -> float:
        """How long a silence of this worker is expected to last now: a step, and the longest
        prompt it has not answered (a prompt's first token may hold every stream back, on an
        engine that prefills whole prompts; the time per prompt token is measured on first tokens,
        so it includes the usual wait behind the others)."""
        longest = max((watch.tokens for watch in self.open if watch.first), default=0)
        return self.step_s + self.token_s * longest


def tokens_to_compute(prompt_tokens: int, decision: RoutingDecision | None, block_size: int | None) -> int:
    """The prompt tokens the chosen worker computes before its first token: all of them, less the
    blocks the router found cached there (`RoutingDecision.cached_blocks`). The watchdog expects
    a first token after these (and learns each worker's time per computed token from them).

    Example:
        >>> from dynamo_nb.router.decision import Candidate
        >>> tokens_to_compute(1000, RoutingDecision("kv", 7, [Candidate(7, 1.0, {"overlap_blocks": 15})]), 64)
        40
        >>> tokens_to_compute(1000, None, 64)
        1000
    """
    cached = decision.cached_blocks if decision is not None else None
    if not cached or not block_size:
        return prompt_tokens
    return max(1, prompt_tokens - cached * block_size)


class StreamWatch:
    """One stream under the watchdog's eye: tell it of each item (`item`) and of the end (`close`)."""

    __slots__ = ("_watchdog", "_worker", "first", "sent", "stream", "tokens")

    def __init__(
        self, watchdog: StreamWatchdog | None, worker: _Worker | None, stream: Any, tokens: int, sent: float
    ) -> None:
        self._watchdog = watchdog
        self._worker = worker
        self.stream = stream
        self.tokens = tokens
        self.sent = sent
        self.first = True

    def item(self, now: float, gap: float | None = None) -> None:
        """An item came at ``now`` (``time.perf_counter()``), ``gap`` seconds after this stream's previous one."""
        worker = self._worker
        if worker is None:
            return
        worker.last = now
        if self.first:
            self.first = False
            per_token = (now - self.sent) / max(self.tokens, 1)
            worker.token_s += _SMOOTHING * (min(per_token, 4 * worker.token_s) - worker.token_s)
        elif gap is not None:
            worker.step_s += _SMOOTHING * (min(gap, 4 * worker.step_s) - worker.step_s)
        if worker.suspect and self._watchdog is not None:
            self._watchdog.cleared(worker, "it sent a token again")

    def close(self) -> None:
        """The stream ended (or moved): it no longer counts for its worker."""
        worker = self._worker
        if worker is None:
            return
        self._worker = None
        worker.open.pop(self, None)


NO_WATCH = StreamWatch(None, None, None, 0, 0.0)
"""The watch of a stream nobody watches (the watchdog is off)."""


class StreamWatchdog:
    """Finds workers that hang and routes around them (see the module docstring).

    Args:
        config: when a silence counts as a hang, and the canaries.
        suspects: the suspect instances the frontend's clients route around.
        metrics: the frontend's metrics (suspect instances, hangs found, canaries).
    """

    def __init__(self, config: WatchdogConfig, suspects: SuspectInstances, metrics: FrontendMetrics) -> None:
        self.config = config
        self.suspects = suspects
        self.metrics = metrics
        self._workers: dict[int, _Worker] = {}
        self._sweep: asyncio.Task[None] | None = None
        self.peak: dict[str, float] = {}
        """Per model: the longest silence of a worker not found hung, as a share of its hang deadline
        (how close a healthy worker came to being suspected; 1: as close as it gets)."""
        self.tick_s = min(config.hang_after / 4, 0.25)

    def start(self) -> None:
        """Start sweeping (on the running loop); nothing when the watchdog is off."""
        if self.config.enabled and self._sweep is None:
            self._sweep = asyncio.get_running_loop().create_task(self._run(), name="dynamo_nb-hang-watchdog")

    async def stop(self) -> None:
        """Stop sweeping and every canary."""
        tasks = [self._sweep] if self._sweep is not None else []
        tasks += [w.canary for w in self._workers.values() if w.canary is not None]
        self._sweep = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def watch(
        self,
        model: ServedModel,
        stream: ResponseStream | RoutedStream,
        prompt_tokens: int,
        decision: RoutingDecision | None = None,
        *,
        client: Client | None = None,
    ) -> StreamWatch:
        """Watch ``stream`` (just sent to its worker with a prompt of ``prompt_tokens`` tokens,
        there by ``decision``) of ``model``, through ``client`` (default: the model's; its prefill
        workers' for a prefill). Its first token is expected after the tokens the worker computes
        (`tokens_to_compute`: the prompt less what the router found cached there)."""
        if self._sweep is None:
            return NO_WATCH
        prompt_tokens = tokens_to_compute(prompt_tokens, decision, model.card.kv_cache_block_size)
        now = time.perf_counter()
        instance_id = stream.instance_id
        worker = self._workers.get(instance_id)
        if worker is None:
            worker = self._workers[instance_id] = _Worker(instance_id, client or model.client, model, now)
        elif not worker.open:
            worker.last = now  # it was idle: its silence starts now
        watch = StreamWatch(self, worker, stream, prompt_tokens, now)
        worker.open[watch] = None
        return watch

    def _deadline(self, worker: _Worker) -> float:
        return max(self.config.hang_after, self.config.hang_factor * worker.expected_s())

    async def _run(self) -> None:
        tick = self.tick_s
        previous = time.perf_counter()
        while True:
            await asyncio.sleep(tick)
            now = time.perf_counter()
            late = now - previous - tick
            previous = now
            if late > tick:  # this loop was stalled: nobody was listening, no worker is to blame
                for worker in self._workers.values():
                    worker.last += late
            self._sweep_once(now)

    def _sweep_once(self, now: float) -> None:
        for worker in list(self._workers.values()):
            if not worker.open:
                if not worker.suspect and not worker.client.listed(worker.instance_id):
                    del self._workers[worker.instance_id]  # gone from discovery
                continue
            if worker.suspect:
                continue
            silent = now - worker.last
            deadline = self._deadline(worker)
            if silent > deadline and not any(watch.stream.ready for watch in worker.open):
                self._hung(worker, silent, deadline)
            elif silent > deadline * self.peak.get(worker.model.name, 0.0):
                self.peak[worker.model.name] = share = min(silent / deadline, 1.0)
                self.metrics.silence_peak.labels(worker.model.name).set(share)

    def _hung(self, worker: _Worker, silent: float, deadline: float) -> None:
        instance_id, model = worker.instance_id, worker.model.name
        reason = (
            f"sent nothing on its {len(worker.open)} stream(s) for {silent:.1f} s "
            f"(expected within {deadline:.1f} s)"
        )
        worker.suspect = True
        self.suspects.mark(instance_id, reason)
        self.metrics.hung_instances.labels(model).inc()
        self.metrics.suspect_instances.labels(model).inc()
        others = [i for i in worker.client.healthy_ids() if i != instance_id]
        what = (
            "its streams move to another worker and it gets no new requests until it answers a canary"
            if others
            else "but no other worker serves the model, so its streams wait for it"
        )
        logger.warning("worker %x of %r %s: suspected of hanging; %s", instance_id, model, reason, what)
        if others:
            for watch in list(worker.open):
                watch.stream.give_up(
                    InstanceDownError(
                        f"instance {instance_id:x} of {model!r} {reason}: treated as hung",
                        endpoint=str(worker.client.endpoint.path),
                        instance_id=instance_id,
                    )
                )
        worker.canary = asyncio.get_running_loop().create_task(
            self._canaries(worker), name=f"dynamo_nb-canary-{instance_id:x}"
        )

    def cleared(self, worker: _Worker, why: str) -> None:
        """``worker`` is back (``why``): routed to again."""
        if not worker.suspect:
            return
        suspicion = self._unsuspect(worker)
        worker.client.report_instance_up(worker.instance_id)
        worker.last = time.perf_counter()
        held = f" after {suspicion.for_s:.1f} s" if suspicion is not None else ""
        logger.info("worker %x of %r is back (%s)%s: routed to again", worker.instance_id, worker.model.name,
                       why, held)  # fmt: skip
        canary, worker.canary = worker.canary, None
        if canary is not None and canary is not asyncio.current_task():
            canary.cancel()

    def _unsuspect(self, worker: _Worker) -> Suspicion | None:
        """``worker`` is no longer suspect (counted); what it was suspected of."""
        worker.suspect = False
        self.metrics.suspect_instances.labels(worker.model.name).dec()
        return self.suspects.clear(worker.instance_id)

    def _forget(self, worker: _Worker) -> None:
        if worker.suspect:
            self._unsuspect(worker)
        if not worker.open:
            self._workers.pop(worker.instance_id, None)

    async def _canaries(self, worker: _Worker) -> None:
        """Canaries to ``worker`` until one answers (or it leaves discovery)."""
        model, config = worker.model, self.config
        canary = PreprocessedRequest(
            token_ids=model.card.eos_token_ids[:1] or [1],
            stop_conditions=StopConditions(max_tokens=1, ignore_eos=True),
            model=model.name,
        ).to_dict()
        while worker.suspect:
            await asyncio.sleep(config.canary_interval)
            if not worker.client.listed(worker.instance_id):
                logger.warning("worker %x of %r left discovery while suspect: forgotten", worker.instance_id,
                               model.name)  # fmt: skip
                self._forget(worker)
                return
            if await self._ask(worker, canary):
                self.metrics.canaries.labels(model.name, "answered").inc()
                self.cleared(worker, "it answered a canary")
                return
            self.metrics.canaries.labels(model.name, "unanswered").inc()

    async def _ask(self, worker: _Worker, canary: dict[str, Any]) -> bool:
        """Whether ``worker`` answers ``canary`` within the canary timeout."""
        context = Context(f"canary-{new_request_id()}")
        try:
            stream = worker.client.direct(canary, worker.instance_id, context=context)
        except RequestError:
            return False
        try:
            await asyncio.wait_for(_a_token(stream), self.config.canary_timeout)
        except RemoteHandlerError:  # its handler ran and refused the canary: it answers
            return True
        except (TimeoutError, RequestError):
            return False
        else:
            return True
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    def status(self) -> list[dict[str, Any]]:
        """The suspect workers, for ``/health``: model, instance, why and for how long."""
        return [
            {
                "model": worker.model.name,
                "instance_id": f"{worker.instance_id:x}",
                "reason": suspicion.reason,
                "for_s": round(suspicion.for_s, 3),
            }
            for worker in self._workers.values()
            if worker.suspect and (suspicion := self.suspects.get(worker.instance_id)) is not None
        ]


async def _a_token(stream: Any) -> None:
    """Read ``stream`` until a token comes (or it ends): a prefill worker's first items only say where its KV goes."""
    async for item in stream:
        if item.get("token_ids") or item.get("finish_reason"):
            return
