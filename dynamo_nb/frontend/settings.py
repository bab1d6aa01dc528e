"""The frontend's settings, typed: built once in a frontend's ``main`` from its flags
(`FrontendConfig.from_args`; the flags' defaults are these), then started (`FrontendConfig.start`).

Example:
    >>> from dynamo_nb.flags import frontend_parser
    >>> config = FrontendConfig.from_args(frontend_parser().parse_args(["--router-mode", "kv"]))
    >>> config.port, config.router_mode, config.kv.overlap_weight, config.migration_limit
    (8000, 'kv', 1.0, 3)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ..llm.card import card_from_folder
from ..router.kv.router import KvRouterConfig
from .admission import DEFAULT_QUEUE_TIMEOUT
from .connections import DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from .migration import DEFAULT_MIGRATION_LIMIT

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime
    from .app import Frontend

__all__ = ["FrontendConfig"]

DEFAULT_HTTP_PORT = 8000


@dataclass(frozen=True)
class FrontendConfig:
    """What a frontend serves and how: its HTTP address, router, admission, migration, and in
    static mode the one model it serves (see `dynamo_nb.frontend.Frontend.start` for each).

    Attributes:
        http_workers: frontend processes sharing the port (this one and ``http_workers - 1``
            replicas, `dynamo_nb.frontend.replicas`).
        static_endpoint: static mode: the worker endpoint of the one model (with
            ``model_name``, ``model_path`` and, on TCP, ``static_address``); None: models
            come from discovery.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_HTTP_PORT
    router_mode: str = "round-robin"
    router_policy: str | None = None  # FILE[:NAME] of a RoutingPolicy (it replaces router_mode)
    kv: KvRouterConfig = field(default_factory=KvRouterConfig)
    enforce_disagg: bool = False
    http_workers: int = 1
    reuse_port: bool = False
    migration_limit: int = DEFAULT_MIGRATION_LIMIT
    max_queue: int | None = None
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    overload_status: int = 503
    routing_records: int = 1024
    request_trace: str | None = None
    static_endpoint: str | None = None
    static_address: str | None = None
    model_name: str | None = None
    model_path: str | None = None
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FrontendConfig:
        """The config the frontend flags (`dynamo_nb.flags.add_frontend_args`, ``--model-*``) give."""
        return cls(
            host=args.http_host,
            port=args.http_port,
            router_mode=args.router_mode,
            router_policy=args.router_policy,
            kv=KvRouterConfig.from_args(args),
            enforce_disagg=args.enforce_disagg,
            http_workers=args.http_workers,
            reuse_port=args.http_workers > 1 or args.http_reuse_port,
            migration_limit=args.migration_limit,
            max_queue=args.max_queue,
            queue_timeout=args.queue_timeout,
            overload_status=args.overload_status,
            routing_records=args.routing_records,
            request_trace=args.request_trace,
            static_endpoint=args.static_endpoint,
            static_address=args.static_address,
            model_name=args.model_name,
            model_path=None if args.model_path is None else str(args.model_path),
            header_timeout=args.http_header_timeout,
            idle_timeout=args.http_idle_timeout,
            max_connections=args.http_max_connections,
        )

    async def start(self, runtime: DistributedRuntime, *, only_endpoint: str | None = None) -> Frontend:
        """Start the frontend on ``runtime``; in static mode its one model's card is built here
        (no etcd, no registration). ``only_endpoint``: serve only the models registered there."""
        policy = None
        if self.router_policy is not None:  # a RoutingPolicy from a .py file or a notebook's export
            from ..notebook.component_program import RoutingPolicy
            from ..notebook.programs import load_component

            # (runnable=False: the file's routing policy, or a ConfigError saying what it declares)
            policy = cast(RoutingPolicy, load_component(self.router_policy, runnable=False))
        from .app import Frontend  # (not at import: a worker's flags read this module's defaults)

        frontend = await Frontend.start(
            runtime,
            host=self.host,
            port=self.port,
            router_mode=self.router_mode,
            router_policy=policy,
            only_endpoint=only_endpoint,
            enforce_disagg=self.enforce_disagg,
            kv_config=self.kv,
            reuse_port=self.reuse_port,
            migration_limit=self.migration_limit,
            max_queue=self.max_queue,
            queue_timeout=self.queue_timeout,
            overload_status=self.overload_status,
            routing_records=self.routing_records,
            request_trace=self.request_trace,
            header_timeout=self.header_timeout,
            idle_timeout=self.idle_timeout,
            max_connections=self.max_connections,
        )
        if self.static_endpoint is not None:
            assert self.model_path is not None  # validate_frontend_args says so first
            card = card_from_folder(self.model_path, name=self.model_name, endpoint=self.static_endpoint)
            await frontend.add_model(card, address=self.static_address)
        return frontend
