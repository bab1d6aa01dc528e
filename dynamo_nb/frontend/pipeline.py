"""The request pipeline behind the HTTP routes, as steps:

1. **preprocess** — the served model (`served_model`), the prompt rendered and tokenized, the
   context checked (`check_context`), a `PreprocessedRequest` built;
2. **admit** — the model's admission control (`dynamo_nb.frontend.admission`): in at once, queued
   while its workers are full, or a 503 with ``Retry-After``;
3. **plan** — with prefill workers, the model's prefill planner plans the disaggregated path
   (fast, fallback or aggregated; `dynamo_nb.router.prefill_planner`), and a handoff the decode refuses
   falls back or fails there, in one place (`PrefillPlanner.fall_back`);
4. **open** — the decode stream sent and its first item awaited, a worker that is down skipped
   (three tries);
5. **relay** — tokens to text (`dynamo_nb.frontend.relay`), a worker lost mid-stream carried on
   by another (`dynamo_nb.frontend.migration`);
6. **write** — SSE chunks or one JSON body (`dynamo_nb.frontend.writers`).

Metrics are counted on the way (`dynamo_nb.frontend.metrics`).

Example::

    pipeline = RequestPipeline(models, metrics, migration_limit=3)
    response = await pipeline.serve(http_request, parse_request(body, "chat"))
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import (
    DisaggregationError,
    EngineError,
    InstanceDownError,
    InstanceNotFoundError,
    InvalidRequestError,
    ModelNotFoundError,
    NoInstancesError,
    OverloadedError,
    RemoteHandlerError,
)
from ..http import HttpRequest, HttpResponse, StreamedResponse
from ..llm import limits
from ..llm.protocol import PreprocessedRequest
from ..router.base import RoutedStream
from ..router.decision import NO_TICKET, RoutingDecision, RoutingTicket
from ..router.prefill_planner import PrefillPlan
from ..runtime.client import Client, ResponseStream
from ..runtime.context import Context
from ..runtime.ids import new_request_id
from ..telemetry.request_ids import set_request_id
from ..telemetry.tracing import inject_trace, span
from .anthropic import write_message, write_message_stream
from .metrics import FrontendMetrics
from .migration import Migration
from .openai import OpenAIRequest, use_tool_parser
from .relay import Outcome, RequestTiming, relay
from .request_trace import RequestTraceWriter, TracedRequest
from .responses import write_response, write_response_stream
from .served_models import ModelManager, ServedModel
from .watchdog import NO_WATCH, StreamWatch, StreamWatchdog
from .writers import write_stream, write_unary

__all__ = ["OPEN_TRIES", "RequestPipeline", "check_context", "model_not_found", "served_model"]

OPEN_TRIES = 3
"""Workers a request is sent to before the frontend answers that none is reachable."""

_ENDPOINT_LABELS = {"chat": "chat_completions", "completions": "completions"}


def model_not_found(models: ModelManager, name: str) -> ModelNotFoundError:
    """The 404 for a model nobody serves, listing the ones served."""
    known = ", ".join(sorted(m.name for m in models.live_models())) or "none yet"
    return ModelNotFoundError(f"model {name!r} not found; served models: {known}", param="model")


def served_model(models: ModelManager, name: str, kind: str) -> ServedModel:
    """The model a request names, live and taking ``kind`` (``chat`` or ``completions``)
    requests; else the error that says what to change."""
    model = models.get(name)
    if model is None:
        raise model_not_found(models, name)
    if not model.live:
        raise NoInstancesError(f"model {name!r} has no workers now; start one that registers it")
    if kind not in model.card.kinds:
        other = "/v1/completions" if kind == "chat" else "/v1/chat/completions"
        raise InvalidRequestError(f"model {name!r} does not take {kind} requests; use {other}", param="model")
    return model


def check_context(model: ServedModel, parsed: OpenAIRequest, prompt_tokens: int) -> None:
    """Refuse a prompt (or prompt + ``max_tokens``) longer than the model's context (a 400)."""
    param = "messages" if parsed.kind == "chat" else "prompt"
    limits.check_context(
        prompt_tokens, parsed.stop.max_tokens, model.card.context_length, model=model.name, prompt_param=param
    )


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_of(http_request: HttpRequest) -> str:
    """The request's id: the client's ``x-request-id`` header (as Dynamo takes it), else a new one.
    It names the answer (``chatcmpl-ID``, the ``x-request-id`` header), travels to the worker as
    the request's context id, and keys its routing decisions."""
    given = http_request.headers.get("x-request-id")
    if given is None:
        return new_request_id()
    if not _REQUEST_ID.fullmatch(given):
        raise InvalidRequestError(
            "the x-request-id header must be 1 to 128 letters, digits or ._:- characters; "
            f"got {given[:40]!r}",
            param="x-request-id",
        )
    return given


def traced(
    request_id: str,
    model: str,
    request: PreprocessedRequest,
    received_ms: float,
    first_s: float | None,
    total_s: float,
    outcome: Outcome | None,
    status: str,
) -> TracedRequest:
    """The request-trace record of a finished request."""
    record = TracedRequest(
        request_id, model, request.token_ids, received_ms, total_ms=total_s * 1000, status=status
    )
    if first_s is not None:
        record.ttft_ms = first_s * 1000
    if outcome is not None:
        record.output_tokens, record.cached_tokens = outcome.completion_tokens, outcome.cached_tokens
        record.finish_reason = outcome.finish_reason
        if first_s is not None and outcome.completion_tokens > 1:
            record.itl_ms = (total_s - first_s) * 1000 / (outcome.completion_tokens - 1)
        plan = outcome.plan
        record.workers = {"decode_worker_id": outcome.stream.instance_id}
        if plan is not None:
            record.path = plan.path
            record.workers["prefill_worker_id"] = plan.prefill_worker
            record.aggregated_because = plan.reason or None
    return record


@dataclass
class Opened:
    """A request's worker stream, its first item, its prefill plan (disaggregated models) and
    the decode router's decision."""

    stream: ResponseStream | RoutedStream
    first: Any
    plan: PrefillPlan | None = None
    decision: RoutingDecision | None = None
    watch: StreamWatch = NO_WATCH  # the hung-worker watchdog's eye on the stream


WRITERS: dict[str, tuple[Any, Any]] = {
    "openai": (write_stream, write_unary),
    "anthropic": (write_message_stream, write_message),  # /v1/messages
    "responses": (write_response_stream, write_response),  # /v1/responses
}
"""Each API's writers of an answer: (streamed, whole)."""


class RequestPipeline:
    """Serves one parsed OpenAI request through the steps above.

    Args:
        models: the served models (their routers, prefill planners, admission).
        metrics: the frontend's Prometheus metrics.
        migration_limit: how often a request whose worker went down moves (0: never).
    """

    def __init__(
        self,
        models: ModelManager,
        metrics: FrontendMetrics,
        migration_limit: int,
        trace: RequestTraceWriter | None = None,
        tool_call_parser: str | None = None,
        watchdog: StreamWatchdog | None = None,
    ) -> None:
        self.models = models
        self.watchdog = watchdog  # the streams it watches move off a worker that hangs
        self.tool_call_parser = tool_call_parser  # --tool-call-parser: tools served, calls read so
        self.metrics = metrics
        self.migration = Migration(migration_limit, self.open_planned, metrics.migrations)
        self.trace = trace  # --request-trace: a line per finished request

    async def preprocess(self, parsed: OpenAIRequest) -> tuple[ServedModel, PreprocessedRequest]:
        """Step 1: the served model and the engine request (rendered, tokenized, checked)."""
        model = served_model(self.models, parsed.model, parsed.kind)
        if parsed.tools:
            if self.tool_call_parser is None:
                raise InvalidRequestError(
                    "tools: this frontend reads no tool calls; start it with --tool-call-parser hermes (the "
                    "format the model writes calls in), or leave tools out",
                    "tools",
                )
            use_tool_parser(parsed, self.tool_call_parser)
        token_ids = await model.tokenize(parsed.kind, parsed.messages, parsed.prompt, parsed.tools)
        check_context(model, parsed, len(token_ids))
        if parsed.guided is not None:
            model.check_guided(parsed.guided)
            prefill = self.models.prefill.get(model.name)
            if prefill is not None and not prefill.enforces_structured_output:
                raise InvalidRequestError(
                    f"{parsed.guided.field}: a prefill worker of model {model.name!r} does not enforce "
                    "structured output (its first token would be unconstrained); serve its prefill with the "
                    "hf engine or vLLM's, or leave the field out",
                    parsed.guided.field,
                )
        request = PreprocessedRequest(
            token_ids=token_ids,
            stop_conditions=parsed.stop,
            sampling_options=parsed.sampling,
            eos_token_ids=model.card.eos_token_ids,
            model=model.name,
            routing=parsed.routing,
            guided_decoding=parsed.guided,
        )
        return model, request

    async def serve(
        self, http_request: HttpRequest, parsed: OpenAIRequest
    ) -> HttpResponse | StreamedResponse:
        """Every step for ``parsed``, answered on ``http_request``; metrics counted whatever the end."""
        started = time.perf_counter()
        received_ms = time.time() * 1000
        request_id = request_id_of(http_request)
        set_request_id(request_id)  # this task's log lines name the request
        with span(
            "request", {"model": parsed.model, "request_id": request_id, "stream": parsed.stream}
        ) as root:
            return await self._serve(http_request, parsed, request_id, started, root, received_ms)

    async def _serve(
        self,
        http_request: HttpRequest,
        parsed: OpenAIRequest,
        request_id: str,
        started: float,
        root: Any,
        received_ms: float,
    ) -> HttpResponse | StreamedResponse:
        model, request = await self.preprocess(parsed)
        metrics = self.metrics.of(model.name)
        status = "error"
        metrics.inflight.inc()
        outcome: Outcome | None = None
        admitted = False
        first_s: float | None = None
        try:
            self.metrics.watch_queue(model.name, model.admission)
            try:
                with span("admission wait"):
                    queued_s = await model.admission.enter(
                        model.capacity(), priority=parsed.priority, strict_priority=parsed.strict_priority
                    )
            except OverloadedError as refused:  # answered at once (503 or 529), counted by its reason
                self.metrics.rejections.labels(model.name, refused.reason).inc()
                raise
            admitted = True
            waited_s = time.perf_counter() - started
            self.metrics.observe_queue_wait(model.name, parsed.strict_priority, queued_s)
            queue = {  # why it went when it did, beside where it went (its routing decision)
                "priority": parsed.priority,
                "strict_priority": parsed.strict_priority,
                "waited_ms": round(queued_s * 1000, 3),
            }
            ticket = RoutingTicket(request_id, model.name, queue=queue)
            opened = await self.open_planned(model, request, ticket)
            if root is not None:
                root.add_event("first token")
            first_s = time.perf_counter() - started
            metrics.ttft.observe(first_s)
            metrics.input_tokens.observe(len(request.token_ids))
            outcome = Outcome(
                opened.stream, opened.plan, ticket=ticket, decision=opened.decision, watch=opened.watch,
                asked=parsed.extra_fields,
                timing=RequestTiming(received_ms, started, waited_s, first_s, len(request.token_ids)),
                returned=[] if parsed.return_token_ids else None,
            )  # fmt: skip
            try:
                pieces = relay(
                    model, request, opened.first, outcome, itl=metrics.itl, migration=self.migration
                )
                with span("stream") as streaming:
                    response: HttpResponse | StreamedResponse
                    streamed, whole = WRITERS[parsed.api]  # the answer in its API's shapes
                    if parsed.stream:
                        response = await streamed(http_request, parsed, pieces, outcome, request.token_ids)
                    else:
                        response = await whole(parsed, pieces, outcome, request.token_ids)
                    if streaming is not None:
                        streaming.add_event("last token", {"completion_tokens": outcome.completion_tokens})
            except ConnectionResetError:
                status = "cancelled"
                raise
            finally:
                outcome.watch.close()
                await outcome.stream.aclose()
            metrics.output_tokens.observe(outcome.completion_tokens)
            self.metrics.observe_reuse(
                model.name, len(request.token_ids), outcome.decision, outcome.cached_tokens
            )
            status = "success" if outcome.error is None else "error"
            return response
        except asyncio.CancelledError:  # the client left (the server cancels its request's task)
            status = "cancelled"
            raise
        finally:
            if outcome is not None:
                outcome.cancel_prefills()  # the prefill goes with its decode
            if admitted:
                model.admission.leave()
            metrics.inflight.dec()
            total_s = time.perf_counter() - started
            metrics.duration.observe(total_s)
            if self.trace is not None:
                self.trace.write(
                    traced(request_id, model.name, request, received_ms, first_s, total_s, outcome, status)
                )
            self.metrics.count_request(
                model.name, _ENDPOINT_LABELS[parsed.kind], "stream" if parsed.stream else "unary", status
            )

    async def open_planned(
        self, model: ServedModel, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET
    ) -> Opened:
        """Steps 3 and 4: the decode stream and its first item, aggregated, or after the model's
        prefill planner planned it; a handoff the decode refuses falls back (or, enforced, fails)."""
        router = self.models.prefill_planner(model.name)
        if router is None:
            return await self.open(model, request, ticket)
        request_id = ticket.request_id
        watchdog, prefill_client = self.watchdog, router.router.client
        watch = None
        if watchdog is not None and isinstance(prefill_client, Client):  # (a frontend's routers' always are)

            def watch(
                stream: Any, request: PreprocessedRequest, decision: RoutingDecision | None
            ) -> StreamWatch:
                return watchdog.watch(model, stream, len(request.token_ids), decision, client=prefill_client)

        last_error: InstanceDownError | None = None
        for _ in range(OPEN_TRIES):
            with span("prefill plan"):  # the prefill worker's span joins the trace from here
                context = Context(request_id, metadata=inject_trace({})) if request_id else None
                plan = await router.plan(
                    request, context=context, ticket=ticket, watch=watch
                )  # enforced: a 503 here
            self.keep(plan.decision)  # why its prefill worker was chosen
            try:
                opened = await self.open(
                    model,
                    plan.decode_request,
                    ticket,
                    on_sent=plan.follow,
                    retry_down=plan.path == "aggregated",
                )
            except InstanceDownError as exc:
                # the decode worker went down (or hangs) before its first item: it may have taken the
                # prefill's KV already, so the request is planned afresh (the worker is skipped now)
                plan.cancel()
                last_error = exc
                continue
            except (RemoteHandlerError, DisaggregationError) as exc:
                # the decode refused the handoff, or its prefill failed (or hung) before the decode had its KV
                if exc.code != DisaggregationError.code:
                    plan.cancel()
                    raise
                message = exc.remote_message if isinstance(exc, RemoteHandlerError) else str(exc)
                plan = router.handoff_failed(plan, request, message)  # or DisaggregationError
                opened = await self.open(model, plan.decode_request, ticket)
            except BaseException:  # e.g. the client left before the first token: the prefill goes too
                plan.cancel()
                raise
            plan.handed_off()  # a decode under way is not given up if its prefill's stream fails later
            self.metrics.disagg_requests.labels(model.name, plan.path).inc()
            opened.plan = plan
            return opened
        raise NoInstancesError(
            f"no decode worker of model {model.name!r} is reachable now (last error: {last_error}); retry later"
        )

    def keep(self, decision: RoutingDecision | None) -> None:
        """A router's finished decision: kept in the frontend's routing records, its time per
        phase observed."""
        if decision is not None:
            self.models.records.add(decision)
            self.metrics.observe_routing(decision)

    async def open(
        self,
        model: ServedModel,
        request: PreprocessedRequest,
        ticket: RoutingTicket = NO_TICKET,
        on_sent: Callable[[Any], None] | None = None,
        retry_down: bool = True,
    ) -> Opened:
        """Step 4: send the request and wait for its first item; a worker that is down is skipped
        (`OPEN_TRIES` tries; with ``retry_down`` False its `InstanceDownError` goes up instead). A
        worker's error (`RemoteHandlerError`) goes up with its status. ``on_sent(stream)``: called
        once it is sent, before its first item (each try)."""
        last_error: Exception | None = None
        for _ in range(OPEN_TRIES):
            try:
                stream, decision = model.send(request, ticket)
            except InstanceNotFoundError:  # the request named an instance (nvext.backend_instance_id)
                raise
            except NoInstancesError:
                break
            self.keep(decision)
            watch = (
                NO_WATCH
                if self.watchdog is None
                else self.watchdog.watch(model, stream, len(request.token_ids), decision)
            )
            if on_sent is not None:
                on_sent(stream)
            try:
                first = await stream.__anext__()
            except StopAsyncIteration:
                watch.close()
                raise EngineError(f"a worker of {model.name!r} ended the stream without output") from None
            except InstanceDownError as exc:  # down (or hung): the next try goes elsewhere
                watch.close()
                if not retry_down:
                    raise
                last_error = exc
                continue
            except BaseException:
                watch.close()
                raise
            watch.item(time.perf_counter())
            return Opened(stream, first, decision=decision, watch=watch)
        detail = f" (last error: {last_error})" if last_error else ""
        raise NoInstancesError(f"no worker of model {model.name!r} is reachable now{detail}; retry later")
