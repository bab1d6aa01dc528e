"""The OpenAI-compatible HTTP frontend: its routes and the error envelope, on the HTTP/1.1
server of `dynamo_nb.http`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE with ``stream: true``,
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

import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AdminAuthError, ConfigError, DynamoNBError, InvalidRequestError, OverloadedError
from ..http import Handler, HttpRequest, HttpResponse, HttpServer, StreamedResponse, json_response
from ..http.connections import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    ConnectionGuard,
)
from ..llm.card import ModelCard, card_from_folder
from ..router.base import Router
from ..router.decision import RoutingRecords
from ..router.function import FunctionRouter, PickFunction
from ..router.kv.router import KvRouter, KvRouterConfig
from ..router.policy import RouterPolicy
from ..runtime.addresses import host_port
from ..runtime.bounded_decode import json_cost_problem
from ..runtime.security import current_security
from .admin import AdminAuth
from .admission import DEFAULT_QUEUE_TIMEOUT
from .error_envelope import error_body, http_error
from .metrics import FrontendMetrics
from .migration import DEFAULT_MIGRATION_LIMIT
from .openai import check_text, parse_request, with_priority_headers
from .pipeline import RequestPipeline, model_not_found
from .policy_sync import PolicySync
from .request_trace import RequestTraceWriter
from .served_models import ModelManager, ServedModel
from .settings import DEFAULT_HTTP_PORT, FrontendConfig

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["DEFAULT_HTTP_PORT", "DEFAULT_MIGRATION_LIMIT", "Frontend"]

logger = logging.getLogger("dynamo_nb.frontend")

MAX_BODY_BYTES = 32 * 1024 * 1024


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
        self.overload_status = 503  # a request refused because a limit was hit (or 529)
        self.pipeline = RequestPipeline(manager, self.metrics, migration_limit)
        self._server: HttpServer | None = None
        self.connections = ConnectionGuard()
        """The header timeout and connection cap, with their counters (`ConnectionGuard`)."""
        self.idle_timeout = DEFAULT_IDLE_TIMEOUT
        self.admin: AdminAuth | None = None
        """Who may use the admin routes; None (the default): they answer 404, saying how to turn them on."""
        self.policy_sync: PolicySync | None = None
        """Shares router policy changes with the other processes of its group (`share_kv_router_policy`)."""
        self._url: str | None = None

    @classmethod
    async def from_config(
        cls,
        runtime: DistributedRuntime,
        config: FrontendConfig,
        *,
        router_policy: PickFunction | None = None,
        only_endpoint: str | None = None,
    ) -> Frontend:
        """Start the frontend ``config`` describes on ``runtime`` (a frontend program's flags:
        `FrontendConfig.from_args`); in static mode its one model's card is built here (no etcd,
        no registration). ``router_policy``: the policy ``config.router_policy`` names, loaded
        by the caller (`dynamo_nb.notebook.programs.load_router_policy`); ``only_endpoint``:
        serve only the models registered there.

        Example::

            config = FrontendConfig.from_args(frontend_parser().parse_args(argv))
            frontend = await Frontend.from_config(runtime, config)
        """
        if config.router_policy is not None and router_policy is None:
            raise ConfigError(
                f"router_policy {config.router_policy!r}: load it first (load_router_policy) and pass it"
            )
        frontend = await cls.start(
            runtime,
            host=config.host,
            port=config.port,
            router_mode=config.router_mode,
            router_policy=router_policy,
            only_endpoint=only_endpoint,
            enforce_disagg=config.enforce_disagg,
            kv_config=config.kv,
            reuse_port=config.reuse_port,
            migration_limit=config.migration_limit,
            max_queue=config.max_queue,
            queue_timeout=config.queue_timeout,
            overload_status=config.overload_status,
            routing_records=config.routing_records,
            request_trace=config.request_trace,
            header_timeout=config.header_timeout,
            idle_timeout=config.idle_timeout,
            max_connections=config.max_connections,
            admin=AdminAuth.from_token_file(config.admin_token_file, current_security().secret)
            if config.admin_api
            else None,
        )
        if config.static_endpoint is not None:
            if config.model_path is None:
                raise ConfigError(
                    "static mode (static_endpoint) needs model_path: the model card is built from it"
                )
            card = card_from_folder(
                config.model_path, name=config.model_name, endpoint=config.static_endpoint
            )
            await frontend.add_model(card, address=config.static_address)
        group = config.router_policy_group
        if group or (config.admin_api and config.http_workers > 1):
            await frontend.share_kv_router_policy(group)
        return frontend

    @classmethod
    async def start(
        cls,
        runtime: DistributedRuntime,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_HTTP_PORT,
        router_mode: str = "round-robin",
        router_policy: PickFunction | None = None,
        only_endpoint: str | None = None,
        enforce_disagg: bool = False,
        kv_config: KvRouterConfig | None = None,
        reuse_port: bool = False,
        migration_limit: int = DEFAULT_MIGRATION_LIMIT,
        max_queue: int | None = None,
        queue_timeout: float = DEFAULT_QUEUE_TIMEOUT,
        overload_status: int = 503,
        routing_records: int = 1024,
        request_trace: str | os.PathLike[str] | None = None,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        admin: AdminAuth | None = None,
    ) -> Frontend:
        """Start serving HTTP on ``host:port`` (port 0: a free one, see `url`).

        Args:
            runtime: where workers are found; its discovery's model cards are followed
                (memory, etcd), or models are added with `add_model` (static).
            router_mode: ``round-robin``, ``random`` or ``kv`` (KV-aware, see `dynamo_nb.router.kv.router`).
            router_policy: a function ``pick(request, instance_ids) -> instance_id`` (such as a
                `dynamo_nb.RoutingPolicy`) that routes every model's requests instead of
                ``router_mode`` (a `FunctionRouter`; prefill workers are still picked round robin).
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
                once (None: no bound; a wait still ends after ``queue_timeout``). See `admission`.
            queue_timeout: seconds a request may wait for a slot before it is refused.
            overload_status: the status of a request refused because a limit was hit (503, or
                529 as Dynamo answers); its message names the limit, the value and the threshold.
            routing_records: how many routing decisions `routing_records` keeps (0: none; a
                request can still ask for its own with ``nvext.extra_fields: ["routing"]``).
            request_trace: a file to append one JSON line to per finished request
                (`dynamo_nb.frontend.request_trace`; read it with `dynamo_nb.bench.read_trace`).
            header_timeout: seconds a new connection has to send its first request's headers
                (a slowloris is closed after it; `dynamo_nb.http.connections`).
            idle_timeout: seconds a keep-alive connection may stay idle between requests.
            max_connections: open connections at most; one more gets a 503 and is closed.
            admin: who may use the admin routes (``GET``/``PATCH /router_policy``); None: they are off.
        """
        if overload_status not in (503, 529):
            raise ConfigError(f"overload_status must be 503 or 529, got {overload_status}")
        if migration_limit < 0:
            raise ConfigError(f"migration_limit must be 0 (off) or more, got {migration_limit}")
        if idle_timeout <= 0:
            raise ConfigError(f"idle_timeout must be a positive number of seconds, got {idle_timeout}")
        try:
            guard = ConnectionGuard(header_timeout, max_connections)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        metrics = FrontendMetrics()
        manager = ModelManager(
            runtime,
            router_mode,
            router_policy=router_policy,
            only_endpoint=only_endpoint,
            enforce_disagg=enforce_disagg,
            on_prefill_error=lambda model: metrics.prefill_errors.labels(model).inc(),
            kv_config=kv_config,
            max_queue=max_queue,
            queue_timeout=queue_timeout,
            records=RoutingRecords(routing_records),
        )
        if not runtime.is_static:
            await manager.watch()
        frontend = cls(runtime, manager, host, port, metrics, migration_limit)
        frontend.overload_status = overload_status
        frontend.connections, frontend.idle_timeout = guard, idle_timeout
        frontend.admin = admin
        metrics.show_router_policy(manager.kv_config.policy)
        if request_trace is not None:
            frontend.pipeline.trace = RequestTraceWriter(request_trace)
        await frontend._listen(reuse_port)
        return frontend

    def kv_router_policy(self) -> RouterPolicy:
        """The KV routers' policy (`dynamo_nb.router.policy.RouterPolicy`): every KV router
        of this frontend, and those it makes for models that come later, decide by it."""
        return self.models.kv_config.policy

    def change_kv_router_policy(
        self, updates: Mapping[str, Any], *, by: str = "this process", peer: str = ""
    ) -> RouterPolicy:
        """Apply ``updates`` (knob → value, Dynamo's names or their aliases) to every KV router
        at once, between two decisions (each decision reads the policy once); logged with
        ``by`` (and the ``peer`` address), old → new, and counted in ``/metrics``
        (``dynamo_frontend_router_policy_changes_total{by}``; the knobs in
        ``dynamo_frontend_router_policy{knob}``). Returns the new policy.

        Example::

            frontend.change_kv_router_policy({"prefill_load_scale": 16, "temperature": 0})
        """
        new = self._set_kv_router_policy(updates, by=by, peer=peer)
        if self.policy_sync is not None:
            self.policy_sync.changed_here(new)
        return new

    def _set_kv_router_policy(self, updates: Mapping[str, Any], *, by: str, peer: str) -> RouterPolicy:
        old = self.kv_router_policy()
        new = old.changed(updates)
        manager = self.models
        manager.kv_config = replace(manager.kv_config, policy=new)
        routers = [m.router for m in manager.models.values()] + [p.router for p in manager.prefill.values()]
        for router in routers:
            if isinstance(router, KvRouter):
                router.policy = new
        changes = ", ".join(f"{knob} {a:g} → {b:g}" for knob, (a, b) in old.differences(new).items())
        source = f"{by} from {peer}" if peer else by
        logger.info("the KV router policy was changed by %s: %s", source, changes or "nothing")
        self.metrics.router_policy_changed(by, new)
        return new

    async def share_kv_router_policy(self, group: str | None = None, *, heartbeat: float = 2.0) -> PolicySync:
        """Share this frontend's router policy changes with the other frontends of ``group``
        (None: a new group; `policy_sync.group` names it) over the event plane, and take theirs:
        what ``--http-workers N`` with the admin API does, so a ``PATCH /router_policy`` reaching
        one process changes them all (`dynamo_nb.frontend.policy_sync`). Needs an event plane
        (``nats_url`` with etcd discovery).

        Example::

            sync = await frontend.share_kv_router_policy()
            await other.share_kv_router_policy(sync.group)
        """
        if self.policy_sync is None:

            def apply(policy: RouterPolicy, source: str) -> None:
                self._set_kv_router_policy(policy.to_dict(), by="another frontend process", peer=source)

            self.policy_sync = await PolicySync.start(
                self.runtime, group or secrets.token_hex(8), apply=apply, heartbeat=heartbeat
            )
        return self.policy_sync

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

    async def _listen(self, reuse_port: bool = False) -> None:
        routes: dict[str, dict[str, Handler]] = {
            "/v1/chat/completions": {"POST": self._errors(self._chat)},
            "/v1/completions": {"POST": self._errors(self._completions)},
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
            idle_timeout=self.idle_timeout,
            max_body=MAX_BODY_BYTES,
            error_body=error_body,
            name="the frontend",
        )
        try:
            await server.start(self.host, self.port, reuse_port=reuse_port)
        except OSError as exc:
            raise ConfigError(
                f"the frontend cannot listen on {self.host}:{self.port} ({exc.strerror or exc}): pick another "
                "--http-port (0 = a free one)"
            ) from None
        self._server = server
        self.port = server.port
        try:
            host = (await self.runtime.addresses.resolve()).advertise(self.host, what=None)
        except BaseException:
            await server.stop()
            raise
        self._url = f"http://{host_port(host, self.port)}"
        logger.info("frontend listening on %s", self.url)

    async def stop(self) -> None:
        """Stop the HTTP server and the KV routers (the runtime stays up)."""
        if self.policy_sync is not None:
            await self.policy_sync.stop()
            self.policy_sync = None
        if self._server is not None:
            await self._server.stop()
            self._server = None
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

    def _errors(self, handler: Handler) -> Handler:
        """``handler`` with our errors answered in OpenAI's envelope (their status), anything
        else a 500 that says to look at the log."""

        async def answer(request: HttpRequest) -> HttpResponse | StreamedResponse:
            try:
                return await handler(request)
            except DynamoNBError as exc:
                status, body = http_error(exc)
                if isinstance(exc, OverloadedError):  # expected under load: no warning per request
                    return json_response(
                        body, status=self.overload_status, headers={"Retry-After": str(exc.retry_after)}
                    )
                if status >= 500:
                    logger.warning("%s %s answered %d: %s", request.method, request.path, status, exc)
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
            raise AdminAuthError(
                404,
                f"{request.path} is an admin route, off on this frontend: start it with --admin-token-file "
                "FILE, or --admin-api with a cluster secret",
            )
        return self.admin.check(request.method, request.path, request.headers, request.body)

    async def _get_router_policy(self, request: HttpRequest) -> HttpResponse:
        self._admin(request)
        return json_response({"policy": self.kv_router_policy().to_dict()})

    async def _patch_router_policy(self, request: HttpRequest) -> HttpResponse:
        who = self._admin(request)
        body = self._json(request)
        if isinstance(body, dict) and isinstance(body.get("policy"), dict):
            body = body["policy"]  # GET's shape, sent back changed
        old = self.kv_router_policy()
        try:
            new = self.change_kv_router_policy(body, by=who, peer=request.peer)
        except ConfigError as exc:
            raise InvalidRequestError(str(exc)) from None
        changed = {knob: {"old": a, "new": b} for knob, (a, b) in old.differences(new).items()}
        return json_response({"policy": new.to_dict(), "changed": changed})

    async def _list_models(self, request: HttpRequest) -> HttpResponse:
        data = [
            {"id": m.name, "object": "model", "created": m.created, "owned_by": "dynamo_nb"}
            for m in sorted(self.models.live_models(), key=lambda m: m.name)
        ]
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
        }
        return json_response(body, status=200 if healthy else 503)

    async def _chat(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_request(self._prompt_json(request, "messages"), "chat")
        return await self.pipeline.serve(request, with_priority_headers(parsed, request.headers))

    async def _completions(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        parsed = parse_request(self._prompt_json(request, "prompt"), "completions")
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
