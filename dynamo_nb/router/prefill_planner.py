"""The frontend's prefill planner: disaggregated prefill/decode, fast path and fallback path.

It is active for a model once a prefill worker of that model has published its card (kind
``prefill``); until then the model is served aggregated. For each request it picks the
prefill worker first with its ``router`` (round robin; with ``--router-mode kv`` the KV
router's choice, by prefix overlap and the load it routed there; a worker whose card came
before discovery showed its instance is waited for, up to ``INSTANCE_WAIT`` seconds) and then:

- **fast path**, when that worker published ``disaggregated_endpoint`` in its runtime config:
  draw a ``bootstrap_room``, send the prefill (``max_tokens`` 1, with ``bootstrap_info``)
  straight to that worker as a background task — its stream drained, its errors logged and
  counted, cancelled together with its decode — and hand back the decode request with the
  same ``bootstrap_info`` at once, so decode does not wait for a prefill round trip;
- **fallback path**, when it published none: send the prefill, wait for its first item,
  require ``disaggregated_params`` (missing keys are a `DisaggregationError` naming them)
  and hand them to decode as ``prefill_result``.

Sending the prefill, awaiting its params and draining its stream are `dynamo_nb.disagg.handoff`'s,
the same steps a decode worker takes when it must ask a prefill worker itself.

If the prefill cannot be sent, or its params are bad, the request is served aggregated with
a warning (``extra_args.aggregated``: the decode worker generates it whole), unless the
router enforces disaggregation: then `DisaggregationError` (the frontend answers 503). The
decode request keeps the request's own ``max_tokens``.

Example::

    plan = await prefill_planner.plan(request)      # a PreprocessedRequest
    plan.path, plan.prefill_worker, plan.room      # ('fast', 7421…, 4611686018427387904)
    stream = decode_router.send(plan.decode_request)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..disagg import handoff
from ..disagg.rooms import BootstrapInfo, draw_room, draw_token
from ..errors import DisaggregationError, NoInstancesError, RequestError
from ..llm.protocol import PreprocessedRequest
from ..runtime.context import Context
from .base import Route, Router
from .decision import NO_TICKET, RoutingDecision, RoutingTicket

__all__ = ["DISAGG_PATHS", "INSTANCE_WAIT", "PrefillPlan", "PrefillPlanner", "WatchPrefill"]

logger = logging.getLogger("dynamo_nb.router")

DISAGG_PATHS = ("fast", "fallback", "aggregated")
INSTANCE_WAIT = 5.0  # seconds a request waits for a prefill worker whose card came before its instance

WatchPrefill = Callable[[Any, PreprocessedRequest, RoutingDecision | None], handoff.ItemWatch]
"""Starts watching a prefill stream (the stream, its request, the decision that chose its worker):
the frontend's watchdog."""


@dataclass
class PrefillPlan:
    """How one request is served: the decode request to send and what was chosen for it.

    Attributes:
        path: ``fast``, ``fallback`` or ``aggregated``.
        decode_request: the request for the decode worker (``bootstrap_info`` on the fast
            path, ``prefill_result`` on the fallback path, ``extra_args.aggregated`` else).
        prefill_worker: the prefill instance id (None when aggregated).
        room: the bootstrap room (None when aggregated).
        reason: why it is aggregated, when it is.
        handoff_s: seconds from the start of planning until the decode request was handed back
            (disaggregated paths): routing alone on the fast path; routing and a round trip to the
            prefill worker (its first item) on the fallback path. The frontend's
            ``x-dynamo-handoff-ms`` header.
        events: what happened, in order (fallback path: ``prefill sent``, ``prefill first item``,
            ``decode handed back``; fast path: ``decode handed back`` at once; then ``prefill done``
            or ``prefill failed``).
    """

    path: str
    decode_request: PreprocessedRequest
    prefill_worker: int | None = None
    room: int | None = None
    reason: str = ""
    handoff_s: float | None = None
    events: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    decision: RoutingDecision | None = None  # why its prefill worker was chosen
    decode_stream: Any = None  # the decode stream, until its first item (`follow`)

    def cancel(self) -> None:
        """Stop the background prefill stream (when the decode ends or is cancelled)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def follow(self, decode_stream: Any) -> None:
        """The decode request was sent as ``decode_stream``: if the prefill fails before the decode's
        first item, the decode stops waiting for its KV (`lost`)."""
        self.decode_stream = decode_stream

    def handed_off(self) -> None:
        """The decode's first item came: it has its KV, the prefill's fate no longer matters to it."""
        self.decode_stream = None

    def lost(self, reason: str) -> None:
        """The prefill failed (or its worker hangs) while the decode waits for its KV: the decode's
        wait ends now with a `DisaggregationError` saying ``reason`` (the frontend then falls back),
        instead of at the decode worker's ``--kv-timeout``."""
        stream, self.decode_stream = self.decode_stream, None
        if stream is not None:
            stream.give_up(DisaggregationError(reason))


class PrefillPlanner:
    """Routes the prefill half of a model's requests; see the module docstring.

    Attributes:
        endpoint: the prefill workers' endpoint path.
        router: picks the prefill worker (`RoundRobinRouter`, or a `KvRouter`).
        errors_total: prefills that failed (before or after their decode was sent).
    """

    def __init__(
        self,
        endpoint: str,
        router: Router,
        *,
        enforce: bool = False,
        prefill_timeout: float = 30.0,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.router = router
        self.enforce = enforce
        self.prefill_timeout = prefill_timeout
        self.errors_total = 0
        self._on_error = on_error
        self._endpoints: dict[int, dict[str, Any] | None] = {}  # instance id → disaggregated_endpoint
        self._keys: dict[str, int] = {}  # card key → instance id
        self._unguided: set[str] = set()  # card keys of workers that do not enforce structured output

    def add_worker(
        self,
        key: str,
        instance_id: int,
        disaggregated_endpoint: dict[str, Any] | None,
        *,
        structured_output: bool = False,
    ) -> None:
        """A prefill worker's card arrived (``disaggregated_endpoint`` None: fallback path for
        it; ``structured_output``: its engine masks the first token by a request's grammar)."""
        self._keys[key] = instance_id
        self._endpoints[instance_id] = disaggregated_endpoint
        if structured_output:
            self._unguided.discard(key)
        else:
            self._unguided.add(key)

    def remove_worker(self, key: str) -> bool:
        """Its card left; True when the key was one of this router's."""
        instance_id = self._keys.pop(key, None)
        self._unguided.discard(key)
        if instance_id is None:
            return False
        self._endpoints.pop(instance_id, None)
        return True

    @property
    def instance_ids(self) -> list[int]:
        """The prefill workers whose cards it holds."""
        return sorted(set(self._keys.values()))

    @property
    def enforces_structured_output(self) -> bool:
        """Whether every prefill worker draws its first token under a request's grammar."""
        return not self._unguided

    @property
    def active(self) -> bool:
        """Whether any prefill worker of the model has a card now."""
        return bool(self._keys)

    async def plan(
        self,
        request: PreprocessedRequest,
        *,
        context: Context | None = None,
        ticket: RoutingTicket = NO_TICKET,
        watch: WatchPrefill | None = None,
    ) -> PrefillPlan:
        """Start the prefill of ``request`` and say how its decode goes (see the module docstring).
        ``context``: the prefill request's id and metadata (a trace's ``traceparent``); ``ticket``:
        what its prefill worker's routing decision is filed under (its hop made ``prefill``);
        ``watch``: watches the prefill stream (the frontend's hung-worker watchdog: a prefill
        worker that hangs gives its stream up, and the plan falls back)."""
        events: list[str] = []
        instance: int | None = None
        started = time.perf_counter()
        try:
            route = await self._pick(request, ticket.for_prefill())
            instance = route.instance_id
            endpoint = self._endpoints.get(instance)
            if endpoint is not None:
                info = BootstrapInfo.parse(
                    {**endpoint, "bootstrap_room": draw_room(), "bootstrap_token": draw_token()},
                    "disaggregated_endpoint",
                )
                stream = self.router.open(route, handoff.prefill_request(request, info), context=context)
                decode = dataclasses.replace(request, bootstrap_info=info)
                plan = PrefillPlan(
                    "fast", decode, instance, info.room, events=events, decision=route.decision
                )
                watching = watch(stream, request, route.decision) if watch is not None else None
                plan.task = self._drain(stream, plan, watching)  # sends the prefill once the task runs
                events.append("decode handed back")
                plan.handoff_s = time.perf_counter() - started
                return plan
            stream = self.router.open(route, handoff.prefill_request(request), context=context)
            events.append("prefill sent")
            watching = watch(stream, request, route.decision) if watch is not None else None
            try:
                result = await handoff.await_params(stream, self.prefill_timeout)
            except BaseException:
                if watching is not None:
                    watching.close()
                await stream.aclose()
                raise
            events.append("prefill first item")
            decode = dataclasses.replace(request, prefill_result=result)
            room = result.bootstrap.room if result.bootstrap is not None else None  # None: vLLM's connector
            plan = PrefillPlan("fallback", decode, instance, room, events=events, decision=route.decision)
            plan.task = self._drain(stream, plan, watching)
            events.append("decode handed back")
            plan.handoff_s = time.perf_counter() - started
            return plan
        except RequestError as exc:
            where = f" (prefill worker {instance:x})" if instance is not None else ""
            return self.fall_back(request, f"prefill failed{where}: {exc}", events)

    async def _pick(self, request: PreprocessedRequest, ticket: RoutingTicket) -> Route:
        """The prefill worker for ``request``. A worker publishes its card and its instance under
        two keys, which a watch may deliver apart: with a card but no instance yet, wait for one."""
        try:
            return self.router.pick(request, ticket)
        except NoInstancesError:
            if not self._keys:
                raise
        await self.router.client.wait_for_instances(timeout=min(INSTANCE_WAIT, self.prefill_timeout))
        return self.router.pick(request, ticket)

    def fall_back(
        self, request: PreprocessedRequest, reason: str, events: list[str], *, count: bool = True
    ) -> PrefillPlan:
        """The one place where a failed prefill or handoff is decided: counted (unless ``count`` is
        False: the failure was counted already), then a `DisaggregationError` (a 503) when
        disaggregation is enforced, else the plan that serves ``request`` aggregated."""
        if count:
            self._count_error()
        if self.enforce:
            raise DisaggregationError(f"{reason}; disaggregation is enforced, so the request fails")
        return self.aggregated(request, reason, events)

    def aggregated(
        self, request: PreprocessedRequest, reason: str, events: list[str] | None = None
    ) -> PrefillPlan:
        """The plan that serves ``request`` on the decode worker alone (logged as a warning)."""
        logger.warning("serving a request aggregated: %s", reason)
        whole = dataclasses.replace(
            request,
            bootstrap_info=None,
            prefill_result=None,
            extra_args={**(request.extra_args or {}), "aggregated": True},
        )
        return PrefillPlan("aggregated", whole, reason=reason, events=events or [])

    def handoff_failed(self, plan: PrefillPlan, request: PreprocessedRequest, message: str) -> PrefillPlan:
        """The decode could not take the KV of ``plan`` (e.g. its prefill worker died): its
        prefill stopped, then `fall_back` decides (aggregated, or enforced: `DisaggregationError`)."""
        plan.cancel()
        plan.events.append("decode refused the handoff")
        logger.warning(
            "prefill → decode handoff failed (%s path, room %s): %s", plan.path, plan.room, message
        )
        counted = "prefill failed" in plan.events  # its prefill's failure was counted as it happened
        return self.fall_back(
            request, f"the prefill → decode handoff failed: {message}", plan.events, count=not counted
        )

    def _count_error(self) -> None:
        self.errors_total += 1
        if self._on_error is not None:
            self._on_error()

    def _drain(
        self, stream: Any, plan: PrefillPlan, watch: handoff.ItemWatch | None = None
    ) -> asyncio.Task[None]:
        """Read (the rest of) the prefill stream in the background; log and count its failure, and
        end the wait of a decode that has not had its first item (`PrefillPlan.lost`)."""
        what = f"prefill on {plan.prefill_worker or 0:x} ({plan.path} path, room {plan.room})"

        def failed(error: RequestError) -> None:
            plan.events.append("prefill failed")
            self._count_error()
            plan.lost(f"the {what} failed: {error}")

        return handoff.drain(
            stream,
            what=what,
            on_failure=failed,
            on_done=lambda: plan.events.append("prefill done"),
            watch=watch,
        )
