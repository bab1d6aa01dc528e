"""The OpenAI-compatible HTTP frontend (aiohttp): preprocess, route, detokenize, stream.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE with ``stream: true``,
ending in ``data: [DONE]``; else one JSON body), ``GET /v1/models``, ``GET /health`` (the
instances behind each model), ``GET /live`` and ``GET /metrics`` (Prometheus).

Example::

    frontend = await Frontend.start(runtime, port=8000)
    frontend.url
    # 'http://127.0.0.1:8000'
    await frontend.stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import (
    ConfigError,
    DisaggregationError,
    DynamoNBError,
    EngineError,
    InstanceDownError,
    InstanceNotFoundError,
    InvalidRequestError,
    ModelNotFoundError,
    NoInstancesError,
    OverloadedError,
    RemoteHandlerError,
    RequestError,
)
from ..llm.card import ModelCard
from ..llm.detokenize import StreamDetokenizer
from ..llm.protocol import PreprocessedRequest
from ..router.base import Router
from ..router.function import FunctionRouter, PickFunction
from ..router.kv.router import KvRouterConfig
from ..router.prefill import PrefillPlan
from ..runtime.client import ResponseStream
from ..runtime.ids import new_request_id
from .errors import error_body, http_error
from .metrics import FrontendMetrics
from .models import ModelManager, ServedModel
from .openai import OpenAIRequest, parse_request

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["DEFAULT_HTTP_PORT", "DEFAULT_MIGRATION_LIMIT", "Frontend"]

logger = logging.getLogger("dynamo_nb.frontend")

DEFAULT_HTTP_PORT = 8000
DEFAULT_MIGRATION_LIMIT = 3  # as Dynamo's guidance
MAX_BODY_BYTES = 32 * 1024 * 1024
_ENDPOINT_LABELS = {"chat": "chat_completions", "completions": "completions"}
_FINISH = {"stop": "stop", "length": "length", "cancelled": "stop", "error": "stop"}
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
_DONE = b"data: [DONE]\n\n"


@dataclass
class _Outcome:
    """What a relayed stream ended with."""

    finish_reason: str = "stop"
    completion_tokens: int = 0
    error: str | None = None
    nvext: dict[str, Any] | None = None  # sent with the last chunk when the request asked for it
    headers: dict[str, str] = field(default_factory=dict)  # who served it, which disaggregated path
    stream: ResponseStream | None = None  # the worker stream relayed now (another after a migration)
    plans: list[PrefillPlan] = field(default_factory=list)  # prefills planned for migrations
    migrations: int = 0


class Frontend:
    """An OpenAI-compatible HTTP server in front of the workers that registered models.

    Create it with `Frontend.start`; with memory or etcd discovery it follows model cards,
    with static discovery give it the model with `add_model`.
    """

    def __init__(
        self,
        runtime: DistributedRuntime,
        manager: ModelManager,
        host: str,
        port: int,
        metrics: FrontendMetrics | None = None,
        migration_limit: int = DEFAULT_MIGRATION_LIMIT,
    ) -> None:
        """Use `Frontend.start`."""
        self.runtime = runtime
        self.models = manager
        self.host = host
        self.port = port
        self.metrics = metrics or FrontendMetrics()
        self.migration_limit = migration_limit
        self._runner: web.AppRunner | None = None

    @classmethod
    async def start(
        cls,
        runtime: DistributedRuntime,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_HTTP_PORT,
        router_mode: str = "round-robin",
        only_endpoint: str | None = None,
        enforce_disagg: bool = False,
        kv_config: KvRouterConfig | None = None,
        reuse_port: bool = False,
        migration_limit: int = DEFAULT_MIGRATION_LIMIT,
        max_queue: int | None = None,
    ) -> Frontend:
        """Start serving HTTP on ``host:port`` (port 0: a free one, see `url`).

        Args:
            runtime: where workers are found; its discovery's model cards are followed
                (memory, etcd), or models are added with `add_model` (static).
            router_mode: ``round-robin``, ``random`` or ``kv`` (KV-aware, see `dynamo_nb.router.kv.router`).
            only_endpoint: serve only the models registered at this endpoint (``ns.comp.ep``).
            enforce_disagg: a model with prefill workers never falls back to aggregated
                serving: a failed prefill is a 503 naming the reason.
            kv_config: the KV router's settings (``router_mode="kv"``).
            reuse_port: listen with ``SO_REUSEPORT``, so other frontend processes can share the
                port (the kernel spreads new connections between them).
            migration_limit: how many times a request whose worker went down mid-stream is
                carried on by another worker (the prompt plus the tokens already streamed; the
                client sees one stream); 0: never, the stream ends with an error event.
            max_queue: requests of a model that may wait at the frontend while its workers are
                full (their cards' ``max_num_seqs``); beyond, a 503 with ``Retry-After`` at
                once (None: no bound; a wait still ends after 60 s). See `admission`.
        """
        if migration_limit < 0:
            raise ConfigError(f"migration_limit must be 0 (off) or more, got {migration_limit}")
        metrics = FrontendMetrics()
        manager = ModelManager(
            runtime,
            router_mode,
            only_endpoint=only_endpoint,
            enforce_disagg=enforce_disagg,
            on_prefill_error=lambda model: metrics.prefill_errors.labels(model).inc(),
            kv_config=kv_config,
            max_queue=max_queue,
        )
        if not runtime.is_static:
            await manager.watch()
        frontend = cls(runtime, manager, host, port, metrics, migration_limit)
        await frontend._listen(reuse_port)
        return frontend

    async def add_model(self, card: ModelCard, *, address: str | None = None) -> ServedModel:
        """Serve ``card``'s model without discovery (static mode); ``address`` for static TCP."""
        return await self.models.add_card(card, address=address)

    async def set_router(self, model: str, router: Router | PickFunction) -> Router:
        """Route ``model``'s requests with ``router`` from now on: a `Router`, or a function
        ``pick(request, instance_ids) -> instance_id`` (a `FunctionRouter`). Returns the router
        it replaces (stopped). Requests already running finish where they are.

        Example::

            def long_prompts_to_the_first(request, instance_ids):
                ids = sorted(instance_ids)
                return ids[0] if len(request.token_ids) > 200 else ids[-1]

            await frontend.set_router("tiny-llama", long_prompts_to_the_first)
        """
        served = self.models.get(model)
        if served is None:
            raise self._not_found(model)
        if not isinstance(router, Router):
            if not callable(router):
                raise ConfigError(
                    f"set_router takes a Router or a function pick(request, instance_ids), got {router!r}"
                )
            router = FunctionRouter(served.client, router)
        previous, served.router = served.router, router
        await previous.stop()
        return previous

    async def wait_for_model(self, name: str, timeout: float = 30.0) -> ServedModel:
        """Wait until a worker serves ``name`` (its card arrived)."""
        return await self.models.wait_for_model(name, timeout)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _listen(self, reuse_port: bool = False) -> None:
        app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/live", self._live)
        app.router.add_get("/metrics", self._metrics)
        # a client that leaves cancels its handler: the decode and its prefill stop at once,
        # even before the first token (aiohttp otherwise notices only at the next write)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_port=reuse_port or None)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"the frontend cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): pick another "
                "--http-port (0 = a free one)"
            ) from None
        if self.port == 0:
            self.port = self._runner.addresses[0][1]
        logger.info("frontend listening on %s", self.url)

    async def stop(self) -> None:
        """Stop the HTTP server and the KV routers (the runtime stays up)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.models.close()

    async def __aenter__(self) -> Frontend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<Frontend {self.url} models={[m.name for m in self.models.live_models()]}>"

    # -- plumbing

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except DynamoNBError as exc:
            status, body = http_error(exc)
            if isinstance(exc, OverloadedError):  # expected under load: no warning per request
                return web.json_response(body, status=status, headers={"Retry-After": str(exc.retry_after)})
            if status >= 500:
                logger.warning("%s %s answered %d: %s", request.method, request.path, status, exc)
            return web.json_response(body, status=status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = {
                404: f"no route {request.method} {request.path}: see /v1/models, /v1/chat/completions, "
                "/v1/completions, /health, /live, /metrics",
                405: f"{request.method} is not allowed on {request.path}",
                413: f"the request body is larger than {MAX_BODY_BYTES} bytes",
            }.get(exc.status, exc.reason)
            return web.json_response(error_body(exc.status, message), status=exc.status)
        except Exception:
            logger.exception("internal error on %s %s", request.method, request.path)
            return web.json_response(
                error_body(500, "internal error in the frontend; see its log"), status=500
            )

    @staticmethod
    async def _json(request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(
                f"the request body is not valid JSON ({exc}); send a JSON object"
            ) from None
        except RecursionError:
            raise InvalidRequestError(
                "the request body is nested too deeply; send a flat JSON object"
            ) from None

    def _not_found(self, name: str) -> ModelNotFoundError:
        known = ", ".join(sorted(m.name for m in self.models.live_models())) or "none yet"
        return ModelNotFoundError(f"model {name!r} not found; served models: {known}", param="model")

    def _served(self, name: str, kind: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise self._not_found(name)
        if not model.live:
            raise NoInstancesError(f"model {name!r} has no workers now; start one that registers it")
        if kind not in model.card.kinds:
            other = "/v1/completions" if kind == "chat" else "/v1/chat/completions"
            raise InvalidRequestError(
                f"model {name!r} does not take {kind} requests; use {other}", param="model"
            )
        return model

    # -- routes

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def _list_models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m.name, "object": "model", "created": m.created, "owned_by": "dynamo_nb"}
            for m in sorted(self.models.live_models(), key=lambda m: m.name)
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        instances = [
            {
                "model": m.name,
                "endpoint": m.card.endpoint,
                "instance_id": f"{i.instance_id:x}",
                "transport": i.transport,
            }
            for m in self.models.live_models()
            for i in m.client.instances()
        ]
        healthy = bool(instances)
        body = {
            "status": "healthy" if healthy else "unhealthy",
            "models": sorted(m.name for m in self.models.live_models()),
            "instances": instances,
        }
        return web.json_response(body, status=200 if healthy else 503)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        started = time.perf_counter()
        parsed = parse_request(await self._json(request), kind)
        model = self._served(parsed.model, kind)
        token_ids = model.tokenize(kind, parsed.messages, parsed.prompt)
        _check_context(model, parsed, len(token_ids))
        engine_request = PreprocessedRequest(
            token_ids=token_ids,
            stop_conditions=parsed.stop,
            sampling_options=parsed.sampling,
            eos_token_ids=model.card.eos_token_ids,
            model=model.name,
            routing=parsed.routing,
        )
        metrics = self.metrics.of(model.name)
        status = "error"
        metrics.inflight.inc()
        plan: PrefillPlan | None = None
        outcome: _Outcome | None = None
        admitted = False
        try:
            self.metrics.watch_queue(model.name, model.admission)
            await model.admission.enter(model.capacity())  # or OverloadedError: 503 at once
            admitted = True
            stream, first, plan = await self._open_planned(model, engine_request)
            metrics.ttft.observe(time.perf_counter() - started)
            metrics.input_tokens.observe(len(token_ids))
            outcome = _Outcome(
                nvext=_nvext(parsed, stream, plan), headers=_route_headers(stream, plan), stream=stream
            )
            try:
                pieces = self._relay(model, engine_request, first, parsed.stop.stop, outcome, metrics.itl)
                if parsed.stream:
                    response = await self._send_stream(request, parsed, pieces, outcome, len(token_ids))
                else:
                    response = await _send_unary(parsed, pieces, outcome, len(token_ids))
            except ConnectionResetError:
                status = "cancelled"
                raise
            finally:
                await outcome.stream.aclose()  # type: ignore[union-attr]
            metrics.output_tokens.observe(outcome.completion_tokens)
            status = "success" if outcome.error is None else "error"
            return response
        except asyncio.CancelledError:  # the client left (aiohttp cancels its handler)
            status = "cancelled"
            raise
        finally:
            for prefill in ([plan] if plan is not None else []) + (outcome.plans if outcome else []):
                prefill.cancel()  # the prefill goes with its decode
            if admitted:
                model.admission.leave()
            metrics.inflight.dec()
            metrics.duration.observe(time.perf_counter() - started)
            self.metrics.count_request(
                model.name, _ENDPOINT_LABELS[kind], "stream" if parsed.stream else "unary", status
            )

    async def _open_planned(
        self, model: ServedModel, engine_request: PreprocessedRequest
    ) -> tuple[ResponseStream, Any, PrefillPlan | None]:
        """Open the decode stream: aggregated, or after the model's prefill router planned it."""
        router = self.models.prefill_router(model.name)
        if router is None:
            stream, first = await self._open(model, engine_request)
            return stream, first, None
        # disaggregation that is enforced fails with the prefill: DisaggregationError, a 503
        plan = await router.plan(engine_request)
        try:
            stream, first = await self._open(model, plan.decode_request)
        except RemoteHandlerError as exc:
            if exc.code != DisaggregationError.code:
                plan.cancel()
                raise
            router.handoff_failed(plan, exc.remote_message)  # the decode could not take the prefill's KV
            if router.enforce:
                raise DisaggregationError(
                    f"the prefill → decode handoff failed: {exc.remote_message}; disaggregation is enforced"
                ) from None
            plan = router.aggregated(engine_request, f"the handoff failed: {exc.remote_message}", plan.events)
            stream, first = await self._open(model, plan.decode_request)
        except BaseException:  # e.g. the client left before the first token: the prefill goes too
            plan.cancel()
            raise
        self.metrics.disagg_requests.labels(model.name, plan.path).inc()
        return stream, first, plan

    async def _open(
        self, model: ServedModel, engine_request: PreprocessedRequest
    ) -> tuple[ResponseStream, Any]:
        """Send the request and wait for its first item; a worker that is down is skipped.

        A worker's error (`RemoteHandlerError`) goes up with the status it carries.
        """
        last_error: Exception | None = None
        for _ in range(3):
            try:
                stream = model.send(engine_request)
            except InstanceNotFoundError:  # the request named an instance (nvext.backend_instance_id)
                raise
            except NoInstancesError:
                break
            try:
                return stream, await stream.__anext__()
            except StopAsyncIteration:
                raise EngineError(f"a worker of {model.name!r} ended the stream without output") from None
            except InstanceDownError as exc:  # marked down by the client: the next try goes elsewhere
                last_error = exc
        detail = f" (last error: {last_error})" if last_error else ""
        raise NoInstancesError(f"no worker of model {model.name!r} is reachable now{detail}; retry later")

    async def _relay(
        self,
        model: ServedModel,
        request: PreprocessedRequest,
        first: Any,
        stop: list[str],
        outcome: _Outcome,
        itl: Any,
    ) -> AsyncIterator[str]:
        """Text pieces of ``outcome.stream``, as soon as they are final; ``outcome`` holds how it
        ended. A worker that goes down mid-stream hands the rest to another (`_migrate`).

        ``itl`` is the model's inter-token latency histogram.
        """
        detok = StreamDetokenizer(model.tokenizer, stop)
        push = detok.push
        stream = outcome.stream
        assert stream is not None
        generated: list[int] | None = [] if self.migration_limit else None  # kept for a migration
        # items are `LLMEngineOutput` dicts, read as they are: no object per token on this hot path
        item = first
        last = time.perf_counter()
        count = 0
        earlier = 0  # tokens streamed by workers that went down (their usage is not in the last one's)
        while True:
            ids = item.get("token_ids") or ()
            count += len(ids)
            if generated is not None:
                generated.extend(ids)
            text = push(ids[0]) if len(ids) == 1 else "".join(push(t) for t in ids)
            if text:
                yield text
            if detok.stopped:
                outcome.finish_reason = "stop"
                break
            finish = item.get("finish_reason")
            if finish is not None:
                outcome.finish_reason = _FINISH.get(finish, "stop")
                usage = item.get("completion_usage")
                if usage and isinstance(usage.get("completion_tokens"), int):
                    count = earlier + usage["completion_tokens"]
                break
            try:
                item = await stream.__anext__()
            except StopAsyncIteration:
                break
            except InstanceDownError as exc:
                moved = await self._migrate(model, request, generated, count, exc, outcome)
                if moved is None:
                    break
                item, stream, earlier = moved, outcome.stream, count
                continue
            except RequestError as exc:
                outcome.error = str(exc)
                break
            now = time.perf_counter()
            itl.observe(now - last)
            last = now
        tail = detok.finish()
        if tail:
            yield tail
        outcome.completion_tokens = count

    async def _migrate(
        self,
        model: ServedModel,
        request: PreprocessedRequest,
        generated: list[int] | None,
        count: int,
        down: InstanceDownError,
        outcome: _Outcome,
    ) -> Any | None:
        """Carry a request whose worker went down on with another worker: the prompt plus the
        ``generated`` tokens (``count`` came), ``max_tokens`` less them
        (`PreprocessedRequest.continued`; without one, the rest of the model's context), routed
        (and, with prefill workers, prefilled) afresh. Its first item, with ``outcome.stream``
        now the new stream; None when it cannot (``outcome`` then holds the error or the end).
        A request pinned to an instance (``nvext.backend_instance_id``) is not moved.
        """
        asked = request.stop_conditions.max_tokens
        if asked is not None and count >= asked:
            outcome.finish_reason = "length"  # every token came; only the last item was lost
            return None
        if generated is None:
            outcome.error = f"{down} (no migration: the frontend runs with --migration-limit 0)"
            return None
        if request.routing and "backend_instance_id" in request.routing:
            outcome.error = f"{down} (the request named this instance, so it is not moved)"
            return None
        if outcome.migrations >= self.migration_limit:
            outcome.error = (
                f"{down} (after {outcome.migrations} migrations, the frontend's --migration-limit)"
            )
            return None
        outcome.migrations += 1
        logger.warning(
            "a worker of %r went down after %d tokens of a request (%s): another carries it on (%d of at most %d)",
            model.name,
            len(generated),
            down,
            outcome.migrations,
            self.migration_limit,
        )
        if asked is None and model.card.context_length:  # else every leg starts a full budget
            request = request.with_max_tokens(model.card.context_length - len(request.token_ids))
        try:
            stream, first, plan = await self._open_planned(model, request.continued(generated))
        except RequestError as exc:
            outcome.error = f"{down}; no other worker could carry the request on: {exc}"
            return None
        self.metrics.migrations.labels(model.name).inc()
        if plan is not None:
            outcome.plans.append(plan)
        outcome.stream = stream
        # who serves it now: a unary answer's headers and the last chunk's nvext say so
        outcome.headers = _route_headers(stream, plan)
        if outcome.nvext is not None:
            outcome.nvext = _worker_ids(stream, plan)
        return first

    async def _send_stream(
        self,
        request: web.Request,
        parsed: OpenAIRequest,
        pieces: AsyncIterator[str],
        outcome: _Outcome,
        prompt_tokens: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**_SSE_HEADERS, **outcome.headers})
        await response.prepare(request)
        chat = parsed.kind == "chat"
        request_id = ("chatcmpl-" if chat else "cmpl-") + new_request_id()
        head = json.dumps(
            {
                "id": request_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()),
                "model": parsed.model,
            },
            separators=(",", ":"),
        )[:-1]
        if chat:
            prefix = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'
            suffix = '},"logprobs":null,"finish_reason":null}]}\n\n'
            await response.write(
                f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]}}\n\n'.encode()
            )
        else:
            prefix = f'data: {head},"choices":[{{"index":0,"text":'
            suffix = ',"logprobs":null,"finish_reason":null}]}\n\n'
        write = response.write
        dumps = json.dumps
        async for text in pieces:
            await write(f"{prefix}{dumps(text)}{suffix}".encode())
        if outcome.error is not None:
            await write(f"data: {dumps(error_body(500, outcome.error))}\n\n".encode())
            await write(_DONE)
            return response
        empty = '"delta":{}' if chat else '"text":""'
        nvext = f',"nvext":{dumps(outcome.nvext)}' if outcome.nvext else ""
        await write(
            f'data: {head},"choices":[{{"index":0,{empty},"logprobs":null,'
            f'"finish_reason":"{outcome.finish_reason}"}}]{nvext}}}\n\n'.encode()
        )
        if parsed.include_usage:
            usage = _usage(prompt_tokens, outcome.completion_tokens)
            await write(f'data: {head},"choices":[],"usage":{dumps(usage)}}}\n\n'.encode())
        await write(_DONE)
        return response


async def _send_unary(
    parsed: OpenAIRequest, pieces: AsyncIterator[str], outcome: _Outcome, prompt_tokens: int
) -> web.Response:
    text = "".join([piece async for piece in pieces])
    if outcome.error is not None:
        raise EngineError(f"the worker failed mid-stream: {outcome.error}")
    chat = parsed.kind == "chat"
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice.update(logprobs=None, finish_reason=outcome.finish_reason)
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + new_request_id(),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, outcome.completion_tokens),
    }
    if outcome.nvext:
        body["nvext"] = outcome.nvext
    return web.json_response(body, headers=outcome.headers)


def _nvext(parsed: OpenAIRequest, stream: ResponseStream, plan: PrefillPlan | None) -> dict[str, Any] | None:
    """Dynamo's ``nvext`` response fields the request asked for (``worker_id``: who served it)."""
    if "worker_id" not in parsed.extra_fields:
        return None
    return _worker_ids(stream, plan)


def _worker_ids(stream: ResponseStream, plan: PrefillPlan | None) -> dict[str, Any]:
    prefill = plan.prefill_worker if plan is not None else None
    return {"worker_id": {"prefill_worker_id": prefill, "decode_worker_id": stream.instance_id}}


def _route_headers(stream: ResponseStream, plan: PrefillPlan | None) -> dict[str, str]:
    """``x-dynamo-*`` response headers: the decode worker, and the disaggregated path when there is one."""
    headers = {"x-dynamo-decode-worker": f"{stream.instance_id:x}"}
    if plan is not None:
        headers["x-dynamo-path"] = plan.path
        if plan.prefill_worker is not None:
            headers["x-dynamo-prefill-worker"] = f"{plan.prefill_worker:x}"
        if plan.room is not None:
            headers["x-dynamo-bootstrap-room"] = str(plan.room)
    return headers


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _check_context(model: ServedModel, parsed: OpenAIRequest, prompt_tokens: int) -> None:
    context = model.card.context_length
    if not context:
        return
    param = "messages" if parsed.kind == "chat" else "prompt"
    if prompt_tokens >= context:
        raise InvalidRequestError(
            f"the prompt is {prompt_tokens} tokens and {model.name!r} has a context of {context}: shorten it",
            param=param,
        )
    asked = parsed.stop.max_tokens
    if asked is not None and prompt_tokens + asked > context:
        raise InvalidRequestError(
            f"{model.name!r} has a context of {context} tokens, but the prompt ({prompt_tokens}) plus "
            f"max_tokens ({asked}) is {prompt_tokens + asked}: lower max_tokens to at most {context - prompt_tokens}",
            param="max_tokens",
        )
