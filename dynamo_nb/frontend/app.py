"""The OpenAI-compatible HTTP frontend: its routes and the error envelope, on the HTTP/1.1
server of `dynamo_nb.http`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``
(Anthropic's Messages API, `dynamo_nb.frontend.anthropic`), ``POST /v1/responses`` (OpenAI's
Responses API, stateless: `dynamo_nb.frontend.responses`) (SSE with ``stream: true``,
ending in ``data: [DONE]``; else one JSON body), ``GET /v1/models``, ``GET /health`` (the
instances behind each model), ``GET /live`` and ``GET /metrics`` (Prometheus). A generate
request is parsed here and served by the request pipeline (`dynamo_nb.frontend.pipeline`:
admit, plan, open, relay, write).

Example::

    frontend = await Frontend.start(runtime, port=8000)
    frontend.url
    # 'http://127.0.0.1:8000'
    await frontend.stop()
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, DynamoNBError, InvalidRequestError, OverloadedError, RouteOffError
from ..http import Handler, HttpRequest, HttpResponse, HttpServer, StreamedResponse, json_response
from ..http.connections import ConnectionGuard
from ..llm.card import ModelCard, card_from_folder
from ..router.base import Router
from ..router.decision import RoutingRecords
from ..router.function import FunctionRouter, PickFunction
from ..runtime.addresses import host_port
from ..runtime.bounded_decode import json_cost_problem
from ..runtime.security import current_security
from .admin import AdminAuth
from .anthropic import anthropic_error_body, parse_messages_request
from .config import DEFAULT_HTTP_PORT, FrontendConfig
from .error_envelope import error_body, http_error
from .metrics import FrontendMetrics
from .migration import DEFAULT_MIGRATION_LIMIT
from .openai import check_text, parse_request, with_priority_headers
from .pipeline import RequestPipeline, model_not_found
from .request_trace import RequestTraceWriter
from .responses import parse_responses_request
from .served_models import ModelManager, ServedModel
from .watchdog import StreamWatchdog

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["DEFAULT_HTTP_PORT", "DEFAULT_MIGRATION_LIMIT", "Frontend"]

logger = logging.getLogger("dynamo_nb.frontend")

MAX_BODY_BYTES = 32 * 1024 * 1024


class Frontend:
    """An OpenAI-compatible HTTP server in front of the workers that registered models.

    Built whole from its `FrontendConfig` (``Frontend(runtime, config)``; nothing is set on
    it afterwards) and started with `open`; `Frontend.start` does both. With memory or etcd
    discovery it follows model cards; with static discovery give it the model with
    `add_model` (``config.static_endpoint`` does that in `open`).

    Attributes:
        config: its settings (`FrontendConfig`).
        models: the served models, their routers and the KV routers' policy (`ModelManager`:
            ``frontend.models.change_kv_router_policy({...})``).
        metrics: its Prometheus metrics (``/metrics``).
        connections: the header timeout and connection cap, with their counters (`ConnectionGuard`).
        admin: who may use the admin routes; None: they answer 404, saying how to turn them on.
    """

    def __init__(
        self,
        runtime: DistributedRuntime,
        config: FrontendConfig | None = None,
        *,
        router_policy: PickFunction | None = None,
        only_endpoint: str | None = None,
        admin: AdminAuth | None = None,
    ) -> None:
        """The frontend ``config`` describes, not listening yet (see `Frontend.start` for the
        other arguments)."""
        config = config or FrontendConfig()
        if config.router_policy is not None and router_policy is None:
            raise ConfigError(
                f"router_policy {config.router_policy!r}: load it first (load_router_policy) and pass it"
            )
        self.runtime = runtime
        self.config = config
        self.metrics = FrontendMetrics()
        metrics = self.metrics
        self.models = ModelManager(
            runtime,
            config,
            router_policy=router_policy,
            only_endpoint=only_endpoint,
            on_prefill_error=lambda model: metrics.prefill_errors.labels(model).inc(),
            on_policy_change=metrics.router_policy_changed,
        )
        metrics.follow_kv_indexes(self.models.kv_index_blocks)
        trace = RequestTraceWriter(config.request_trace) if config.request_trace is not None else None
        self.watchdog = StreamWatchdog(config.watchdog, self.models.suspects, metrics)
        self.pipeline = RequestPipeline(
            self.models,
            self.metrics,
            config.migration_limit,
            trace=trace,
            tool_call_parser=config.tool_call_parser,
            watchdog=self.watchdog,
        )
        self.connections = ConnectionGuard(config.header_timeout, config.max_connections)
        if admin is None and config.admin_enabled:
            admin = AdminAuth.from_token_file(config.admin_token_file, current_security().secret)
        self.admin = admin
        self._server: HttpServer | None = None
        self._url: str | None = None

    @classmethod
    async def start(
        cls,
        runtime: DistributedRuntime,
        config: FrontendConfig | None = None,
        *,
        router_policy: PickFunction | None = None,
        only_endpoint: str | None = None,
        admin: AdminAuth | None = None,
        **overrides: Any,
    ) -> Frontend:
        """Start serving HTTP as ``config`` says, with ``overrides`` (any `FrontendConfig`
        field: ``port=0`` for a free port, ``router_mode="kv"``, ``kv=KvRouterConfig(...)``,
        ``request_trace=path``, ``migration_limit=0``, …; each field's help is its flag's in
        ``python components/frontend.py --help``).

        Args:
            runtime: where workers are found; its discovery's model cards are followed
                (memory, etcd), or models are added with `add_model` (static).
            config: the settings (`FrontendConfig.from_args` for a program's flags); None: the defaults.
            router_policy: a function ``pick(request, instance_ids) -> instance_id`` (such as a
                `dynamo_nb.RoutingPolicy`) that routes every model's requests instead of
                ``router_mode`` (a `FunctionRouter`; prefill workers are still picked round robin);
                ``config.router_policy`` names its file, loaded by the caller
                (`dynamo_nb.notebook.component_program.load_router_policy`).
            only_endpoint: serve only the models registered at this endpoint (``ns.comp.ep``).
            admin: who may use the admin routes (``GET``/``PATCH /router_policy``); None: as
                ``config.admin_api`` / ``admin_token_file`` say (off by default).

        Example::

            frontend = await Frontend.start(runtime, port=0, router_mode="kv")
            config = FrontendConfig.from_args(frontend_parser().parse_args(argv))
            frontend = await Frontend.start(runtime, config)
        """
        if overrides:
            config = replace(config or FrontendConfig(), **_known_fields(overrides))
        frontend = cls(runtime, config, router_policy=router_policy, only_endpoint=only_endpoint, admin=admin)
        await frontend.open()
        return frontend

    async def open(self) -> None:
        """Follow model cards (or, in static mode, serve ``config``'s one model), share policy
        changes as ``config`` says, and listen."""
        config, models = self.config, self.models
        self.metrics.show_router_policy(models.kv_router_policy())
        self.watchdog.start()
        if not self.runtime.is_static:
            await models.watch()
        await self._listen()
        try:
            if config.static_endpoint is not None and config.model_path is not None:  # (both, checked)
                path, name, endpoint = config.model_path, config.model_name, config.static_endpoint
                await self.add_model(
                    card_from_folder(path, name=name, endpoint=endpoint), address=config.static_address
                )
            group = config.router_policy_group
            if group or (config.admin_enabled and config.http_workers > 1):
                await models.share_kv_router_policy(group)
        except BaseException:
            await self.stop()
            raise

    @property
    def host(self) -> str:
        """The host it listens on (``config.host``)."""
        return self.config.host

    @property
    def port(self) -> int:
        """The port it listens on (the free one it got for ``config.port`` 0, once listening)."""
        return self._server.port if self._server is not None else self.config.port

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
            raise model_not_found(self.models, model)
        if not isinstance(router, Router):
            if not callable(router):
                raise ConfigError(
                    f"set_router takes a Router or a function pick(request, instance_ids), got {router!r}"
                )
            router = FunctionRouter(served.client, router)
        previous, served.router = served.router, router
        await previous.stop()
        return previous

    @property
    def routing_records(self) -> RoutingRecords:
        """The last routing decisions (`dynamo_nb.router.RoutingRecords`): ``.get(request_id)``,
        ``.table()`` (a DataFrame, a row per candidate), ``.rows()``.

        Example::

            frontend.routing_records.get(response.headers["x-request-id"]).explain()
            # 'kv chose 7598… (lowest cost; score 12, next best 20, margin 8) of 2 candidates'
        """
        return self.models.records

    def request_trace(self) -> Path:
        """The request trace (``request_trace=``) with every finished request written so far:
        its path, for `dynamo_nb.bench.read_trace`.

        Example::

            trace = bench.read_trace(frontend.request_trace())
        """
        writer = self.pipeline.trace
        if writer is None:
            raise ConfigError("this frontend keeps no request trace: start it with request_trace=PATH")
        return writer.flush()

    async def wait_for_model(self, name: str, timeout: float = 30.0) -> ServedModel:
        """Wait until a worker serves ``name`` (its card arrived)."""
        return await self.models.wait_for_model(name, timeout)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` clients reach it at (for a wildcard ``host``, this host's address
        that reaches discovery, or loopback: `dynamo_nb.runtime.addresses`); set once it listens."""
        return self._url or f"http://{host_port(self.host, self.port)}"

    async def _listen(self) -> None:
        routes: dict[str, dict[str, Handler]] = {
            "/v1/chat/completions": {"POST": self._errors(self._chat)},
            "/v1/completions": {"POST": self._errors(self._completions)},
            "/v1/messages": {"POST": self._errors(self._messages, anthropic=True)},
            "/v1/responses": {"POST": self._errors(self._responses)},
            "/v1/models": {"GET": self._errors(self._list_models)},
            "/health": {"GET": self._errors(self._health)},
            "/live": {"GET": self._errors(self._live)},
            "/metrics": {"GET": self._errors(self._metrics)},
            "/router_policy": {
                "GET": self._errors(self._get_router_policy),
                "PATCH": self._errors(self._patch_router_policy),
            },
        }
        server = HttpServer(
            routes,
            self.connections,
            idle_timeout=self.config.idle_timeout,
            max_body=MAX_BODY_BYTES,
            error_body=error_body,
            name="the frontend",
        )
        try:
            await server.start(self.host, self.port, reuse_port=self.config.shares_port)
        except OSError as exc:
            raise ConfigError(
                f"the frontend cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): pick another "
                "--http-port (0 = a free one)"
            ) from None
        self._server = server
        try:
            host = (await self.runtime.addresses.resolve()).advertise(self.host, what=None)
        except BaseException:
            await server.stop()
            raise
        self._url = f"http://{host_port(host, self.port)}"
        logger.info("frontend listening on %s", self.url)

    async def stop(self) -> None:
        """Stop the HTTP server and the KV routers (the runtime stays up)."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.watchdog.stop()
        await self.models.close()
        if self.pipeline.trace is not None:
            self.pipeline.trace.close()

    async def __aenter__(self) -> Frontend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __repr__(self) -> str:
        return f"<Frontend {self.url} models={[m.name for m in self.models.live_models()]}>"

    # -- plumbing

    def _errors(self, handler: Handler, *, anthropic: bool = False) -> Handler:
        """``handler`` with our errors answered in OpenAI's envelope (their status; with
        ``anthropic``, Anthropic's), anything else a 500 that says to look at the log."""

        async def answer(request: HttpRequest) -> HttpResponse | StreamedResponse:
            try:
                return await handler(request)
            except DynamoNBError as exc:
                status, body = http_error(exc)
                if anthropic:
                    body = anthropic_error_body(status, body["error"]["message"])
                if isinstance(exc, OverloadedError):  # expected under load: no warning per request
                    return json_response(
                        body,
                        status=self.config.overload_status,
                        headers={"Retry-After": str(exc.retry_after)},
                    )
                if status >= 500:  # a user's code that raised (a routing function): its traceback too
                    cause = exc.__cause__
                    traced = cause is not None and not isinstance(cause, DynamoNBError)
                    logger.warning(
                        "%s %s answered %d: %s", request.method, request.path, status, exc,
                        exc_info=cause if traced else None,
                    )  # fmt: skip
                return json_response(body, status=status)

        return answer

    @staticmethod
    def _json(request: HttpRequest) -> Any:
        raw = request.body
        problem = json_cost_problem(raw)
        if problem is not None:
            raise InvalidRequestError(problem)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(
                f"the request body is not valid JSON ({exc}); send a JSON object"
            ) from None
        except RecursionError:
            raise InvalidRequestError(
                "the request body is nested too deeply; send a flat JSON object"
            ) from None
        check_text(raw, body)
        return body

    # -- routes

    async def _live(self, request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live"})

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    def _admin(self, request: HttpRequest) -> str:
        """Who sent this admin request (`AdminAuth.check`), or the error that refuses it."""
        if self.admin is None:
            raise RouteOffError(
                f"{request.path} is an admin route, off on this frontend: start it with --admin-token-file "
                "FILE, or --admin-api with a cluster secret"
            )
        return self.admin.check(request.method, request.path, request.headers, request.body)

    async def _get_router_policy(self, request: HttpRequest) -> HttpResponse:
        self._admin(request)
        return json_response({"policy": self.models.kv_router_policy().to_dict()})

    async def _patch_router_policy(self, request: HttpRequest) -> HttpResponse:
        who = self._admin(request)
        body = self._json(request)
        if isinstance(body, dict) and isinstance(body.get("policy"), dict):
            body = body["policy"]  # GET's shape, sent back changed
        old = self.models.kv_router_policy()
        try:
            new = self.models.change_kv_router_policy(body, by=who, peer=request.peer)
        except ConfigError as exc:
            raise InvalidRequestError(str(exc)) from None
        changed = {knob: {"old": a, "new": b} for knob, (a, b) in old.differences(new).items()}
        return json_response({"policy": new.to_dict(), "changed": changed})

    async def _list_models(self, request: HttpRequest) -> HttpResponse:
        data = [  # max_model_len as vLLM lists it: a client (an upstream worker) learns the context
            {"id": m.name, "object": "model", "created": m.created, "owned_by": "dynamo_nb",
             "max_model_len": m.card.context_length}
            for m in sorted(self.models.live_models(), key=lambda m: m.name)
        ]  # fmt: skip
        return json_response({"object": "list", "data": data})

    async def _health(self, request: HttpRequest) -> HttpResponse:
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
        prefill = [
            {"model": name, "endpoint": planner.endpoint, "instance_id": f"{instance_id:x}"}
            for name, planner in sorted(self.models.prefill.items())
            for instance_id in planner.instance_ids
        ]
        healthy = bool(instances)
        body = {
            "status": "healthy" if healthy else "unhealthy",
            "models": sorted(m.name for m in self.models.live_models()),
            "instances": instances,
            "prefill_instances": prefill,
            "suspect_instances": self.watchdog.status(),
        }
        return json_response(body, status=200 if healthy else 503)

    async def _chat(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_request(self._prompt_json(request, "messages"), "chat")
        return await self.pipeline.serve(request, with_priority_headers(parsed, request.headers))

    async def _completions(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_request(self._prompt_json(request, "prompt"), "completions")
        return await self.pipeline.serve(request, with_priority_headers(parsed, request.headers))

    async def _messages(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_messages_request(self._prompt_json(request, "messages"))
        return await self.pipeline.serve(request, with_priority_headers(parsed, request.headers))

    async def _responses(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_responses_request(self._prompt_json(request, "input"))
        return await self.pipeline.serve(request, with_priority_headers(parsed, request.headers))

    def _prompt_json(self, request: HttpRequest, param: str) -> Any:
        """A generate request's JSON; a body larger than any served model's context could take
        is refused before it is decoded, rendered or tokenized (the work bounded by the model)."""
        bound = self.models.body_bytes_bound()
        if bound is not None and len(request.body) > bound:
            raise InvalidRequestError(
                f"the body is {len(request.body)} bytes, more than a prompt that fits the served models' "
                f"contexts can take ({bound} bytes at most): shorten the prompt",
                param=param,
            )
        return self._json(request)


def _known_fields(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` if each names a `FrontendConfig` field, else the error naming the close ones."""
    names = [item.name for item in fields(FrontendConfig)]
    for key in overrides:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=2)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ConfigError(f"Frontend.start got {key}=, which is no FrontendConfig field{hint}")
    return overrides
