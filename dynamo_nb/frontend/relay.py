"""The relay step of the request pipeline: a worker's stream of `LLMEngineOutput` items turned
into text pieces as soon as they are final (stop strings applied), counting tokens and
inter-token latency; a worker that goes down mid-stream hands the rest to another
(`dynamo_nb.frontend.migration`). What the stream ended with is kept in its `Outcome`.

Example::

    outcome = Outcome(stream, plan, worker_ids=False)
    async for text in relay(model, request, first, outcome, itl=histogram, migration=migration):
        ...
    outcome.finish_reason, outcome.completion_tokens   # ('length', 16)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InstanceDownError, RequestError
from ..llm.detokenize import StreamDetokenizer
from ..llm.protocol import PreprocessedRequest
from ..router.decision import NO_TICKET, RoutingDecision, RoutingTicket
from ..router.prefill_planner import PrefillPlan
from ..runtime.client import ResponseStream
from ..runtime.planes.channel import NOT_READY
from .migration import Migration, Stopped
from .watchdog import NO_WATCH, StreamWatch

if TYPE_CHECKING:
    from ..router.base import RoutedStream
    from .served_models import ServedModel

__all__ = ["Outcome", "relay"]

_FINISH = {"stop": "stop", "length": "length", "cancelled": "stop", "error": "stop"}
"""An engine's finish reason → OpenAI's."""


@dataclass(slots=True)
class RequestTiming:
    """When a request arrived (``received_ms``, Unix ms; ``started``, ``perf_counter``), how long
    it waited to be let in (``waited_s``) and for its first token (``first_s``), both from the start."""

    received_ms: float
    started: float
    waited_s: float
    first_s: float
    prompt_tokens: int

    def nvext(self, cached_tokens: int | None) -> dict[str, Any]:
        """Dynamo's ``nvext.timing`` fields, the request's end being now."""
        return {
            "request_received_ms": int(self.received_ms),
            "prefill_wait_time_ms": round(self.waited_s * 1000, 3),
            "prefill_time_ms": round((self.first_s - self.waited_s) * 1000, 3),
            "ttft_ms": round(self.first_s * 1000, 3),
            "total_time_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "kv_hit_rate": None
            if cached_tokens is None
            else round(cached_tokens / max(self.prompt_tokens, 1), 4),
        }


@dataclass
class Outcome:
    """One request's relayed stream: the worker stream read now (another after a migration),
    who serves it, and what it ended with.

    Attributes:
        stream: the worker stream relayed now.
        plan: its prefill plan (None: the model has no prefill workers).
        ticket: what its routing decisions are filed under (its ``request_id`` is the answer's
            ``id`` and ``x-request-id``).
        decision: why the decode router chose the worker serving it now.
        asked: the ``nvext.extra_fields`` the request asked for (``worker_id``, ``routing``, ``timing``).
        timing: when it arrived, waited and had its first token (for ``nvext.timing``).
        plans: every prefill planned for it (cancelled with the request).
        finish_reason: OpenAI's, once it ended.
        completion_tokens: tokens generated, across workers.
        cached_tokens: prompt tokens whose KV the (last) engine reused, when it said (OpenAI's
            ``usage.prompt_tokens_details.cached_tokens``).
        error: why it ended early, when it did.
        ending: the relay has the stream's last item (what it yields now is the last text).
        returned: every token id generated so far, when the request asked for them (vLLM's
            ``return_token_ids``); None when it did not.
    """

    stream: ResponseStream | RoutedStream
    plan: PrefillPlan | None
    ticket: RoutingTicket = NO_TICKET
    decision: RoutingDecision | None = None
    asked: frozenset[str] = frozenset()
    timing: RequestTiming | None = None
    plans: list[PrefillPlan] = field(default_factory=list)
    finish_reason: str = "stop"
    completion_tokens: int = 0
    cached_tokens: int | None = None
    error: str | None = None
    ending: bool = False
    returned: list[int] | None = None
    stop_sequence: str | None = None  # the stop string that ended it (Anthropic's stop_sequence)
    watch: StreamWatch = NO_WATCH  # the hung-worker watchdog's eye on ``stream``

    def __post_init__(self) -> None:
        if self.plan is not None:
            self.plans.append(self.plan)

    @property
    def request_id(self) -> str:
        """The request's id (the answer's ``id`` and ``x-request-id``)."""
        return self.ticket.request_id

    def served_by(
        self,
        stream: ResponseStream | RoutedStream,
        plan: PrefillPlan | None,
        decision: RoutingDecision | None = None,
        watch: StreamWatch = NO_WATCH,
    ) -> None:
        """Another worker carries the request on (a migration) with ``stream``."""
        self.watch.close()
        self.stream, self.plan, self.decision, self.watch = stream, plan, decision, watch
        if plan is not None:
            self.plans.append(plan)

    @property
    def headers(self) -> dict[str, str]:
        """``x-dynamo-*`` response headers: the decode worker, and the disaggregated path when
        there is one (``x-dynamo-path``, ``x-dynamo-prefill-worker``, ``x-dynamo-bootstrap-room``,
        and ``x-dynamo-handoff-ms``: how long the decode request waited for its prefill plan)."""
        headers = {"x-dynamo-decode-worker": f"{self.stream.instance_id:x}", "x-request-id": self.request_id}
        plan = self.plan
        if plan is not None:
            headers["x-dynamo-path"] = plan.path
            if plan.prefill_worker is not None:
                headers["x-dynamo-prefill-worker"] = f"{plan.prefill_worker:x}"
            if plan.room is not None:
                headers["x-dynamo-bootstrap-room"] = str(plan.room)
            if plan.handoff_s is not None:
                headers["x-dynamo-handoff-ms"] = f"{plan.handoff_s * 1000:.3f}"
        return headers

    @property
    def nvext(self) -> dict[str, Any] | None:
        """Dynamo's ``nvext`` answer fields the request asked for: ``worker_id`` (who served it),
        ``routing`` (why: the decode router's decision, and the prefill router's, or why a model
        with prefill workers served it aggregated: ``aggregated_because``), ``timing``
        (as Dynamo's: arrival, the wait to be let in, prefill, TTFT, total, KV hit rate)."""
        if not self.asked:
            return None
        fields: dict[str, Any] = {}
        prefill = self.plan.prefill_worker if self.plan is not None else None
        if "worker_id" in self.asked:
            fields["worker_id"] = {"prefill_worker_id": prefill, "decode_worker_id": self.stream.instance_id}
        if "routing" in self.asked:
            prefill_decision = self.plan.decision if self.plan is not None else None
            fields["routing"] = {
                "decode": self.decision.to_dict() if self.decision is not None else None,
                "prefill": prefill_decision.to_dict() if prefill_decision is not None else None,
            }
            if self.plan is not None and self.plan.reason:  # a prefill given up, failed or skipped
                fields["routing"]["aggregated_because"] = self.plan.reason
        if "timing" in self.asked and self.timing is not None:
            fields["timing"] = self.timing.nvext(self.cached_tokens)
        return fields or None

    def cancel_prefills(self) -> None:
        """Stop every prefill planned for the request (they go with their decode)."""
        for plan in self.plans:
            plan.cancel()


async def relay(
    model: ServedModel,
    request: PreprocessedRequest,
    first: Any,
    outcome: Outcome,
    *,
    itl: Any,
    migration: Migration,
) -> AsyncIterator[str]:
    """Text pieces of ``outcome.stream`` (its ``first`` item already read), as soon as they are
    final (the first may be ""); ``outcome`` holds how it ended. A worker that goes down mid-stream hands the rest to
    another (``migration``). ``itl`` is the model's inter-token latency histogram."""
    detok = StreamDetokenizer(model.tokenizer, request.stop_conditions.stop or [])
    push = detok.push
    stream = outcome.stream
    moving = migration.follow(model, request, outcome.ticket)
    # items are `LLMEngineOutput` dicts, read as they are: no object per token on this hot path
    item = first
    last = time.perf_counter()
    count = 0
    earlier = 0  # tokens streamed by workers that went down (their usage is not in the last one's)
    returned = outcome.returned
    watch = outcome.watch
    queued = 0  # items relayed as they came with the one before (gap 0), observed at the end
    try:
        while True:
            ids: Sequence[int] = item.get("token_ids") or ()
            count += len(ids)
            if returned is not None:
                returned.extend(ids)
            moving.record(ids)
            text = push(ids[0]) if len(ids) == 1 else "".join(push(t) for t in ids)
            finish = item.get("finish_reason")
            if finish is not None or detok.stopped:
                outcome.ending = True  # this text is the last: the writer sends it with the stream's end
            if text or item is first:  # "" for a first item without text: the writer sends its head
                yield text
            if detok.stopped:
                outcome.finish_reason = "stop"
                outcome.stop_sequence = detok.stopped_by
                break
            if finish is not None:
                outcome.finish_reason = _FINISH.get(finish, "stop")
                usage = item.get("completion_usage")
                if usage:
                    if isinstance(usage.get("completion_tokens"), int):
                        count = earlier + usage["completion_tokens"]
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                        outcome.cached_tokens = details["cached_tokens"]
                break
            try:
                item = stream.next_ready()  # an item already queued: no await for it
                if item is not NOT_READY:  # it came with the one before: no gap, nothing new heard
                    queued += 1
                    continue
                item = await stream.__anext__()
            except StopAsyncIteration:
                break
            except InstanceDownError as exc:
                moved = await moving.carry_on(count, exc)
                if isinstance(moved, Stopped):
                    if moved.finish_reason is not None:
                        outcome.finish_reason = moved.finish_reason
                    else:
                        outcome.error = moved.error
                    break
                # a unary answer's headers and the last chunk's nvext say who carried it on
                outcome.served_by(moved.stream, moved.plan, moved.decision, moved.watch)
                item, stream, earlier, watch = moved.first, moved.stream, count, moved.watch
                continue
            except RequestError as exc:
                outcome.error = str(exc)
                break
            now = time.perf_counter()
            itl.observe(now - last)
            watch.item(now, now - last)
            last = now
    finally:
        if queued:
            itl.observe_zeros(queued)
    tail = detok.finish()
    if tail:
        yield tail
    outcome.completion_tokens = count
