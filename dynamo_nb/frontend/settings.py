"""The frontend's settings, typed: a frontend program's flags checked (`check_frontend_args`),
then built once (`FrontendConfig.from_args`; the flags' defaults are these) and started by
`dynamo_nb.frontend.Frontend.from_config`.

Example:
    >>> from dynamo_nb.flags import frontend_parser
    >>> config = FrontendConfig.from_args(frontend_parser().parse_args(["--router-mode", "kv"]))
    >>> config.port, config.router_mode, config.kv.policy.prefill_load_scale, config.migration_limit
    (8000, 'kv', 1.0, 3)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..http.connections import DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from ..llm.card import check_model_dir
from ..router.kv.router import KvRouterConfig
from ..runtime.names import DEFAULT_WORKER_ENDPOINT, EndpointPath
from .admission import DEFAULT_QUEUE_TIMEOUT
from .migration import DEFAULT_MIGRATION_LIMIT

__all__ = ["DEFAULT_HTTP_PORT", "FrontendConfig", "check_frontend_args"]

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
    admin_api: bool = False  # GET/PATCH /router_policy, with the cluster secret or the token below
    admin_token_file: str | None = None
    router_policy_group: str | None = None  # frontends that share router policy changes (event plane)

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
            admin_api=args.admin_api or args.admin_token_file is not None,
            admin_token_file=args.admin_token_file,
            router_policy_group=args.router_policy_group,
        )


def check_frontend_args(args: argparse.Namespace) -> None:
    """Refuse, before anything starts, a combination of a frontend program's flags that cannot
    work, naming the flag and the fix (no file is read: ``--router-policy`` is loaded by
    `dynamo_nb.notebook.programs.load_router_policy`).

    Example:
        >>> from dynamo_nb.flags import frontend_parser
        >>> check_frontend_args(frontend_parser().parse_args([]))
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: a frontend on its own finds workers through etcd: add --discovery etcd://HOST:PORT, ...
    """
    if args.http_workers < 1:
        raise ConfigError(f"--http-workers must be at least 1, got {args.http_workers}")
    if args.max_queue is not None and args.max_queue < 0:
        raise ConfigError(f"--max-queue must be 0 or more (or left out: no bound), got {args.max_queue}")
    if args.router_policy_group and not args.nats_url:
        raise ConfigError(
            "--router-policy-group shares policy changes over the event plane: add --nats-url nats://HOST:PORT"
        )
    if (args.admin_api or args.admin_token_file) and args.http_workers > 1 and not args.nats_url:
        raise ConfigError(
            "the admin API with --http-workers N shares a policy change between the N processes over "
            "the event plane: add --nats-url nats://HOST:PORT, or use --http-workers 1"
        )
    if args.routing_records < 0:
        raise ConfigError(f"--routing-records must be 0 (keep none) or more, got {args.routing_records}")
    if args.queue_timeout <= 0:
        raise ConfigError(f"--queue-timeout must be more than 0 seconds, got {args.queue_timeout:g}")
    if args.migration_limit < 0:
        raise ConfigError(f"--migration-limit must be 0 (off) or more, got {args.migration_limit}")
    if args.router_policy and args.router_mode != "round-robin":
        raise ConfigError(
            f"--router-policy routes with your policy instead of --router-mode {args.router_mode}: "
            "give one of the two"
        )
    if (
        args.router_mode == "kv"
        and not args.no_kv_events
        and not args.nats_url
        and args.discovery != "memory"
    ):
        raise ConfigError(
            "--router-mode kv follows the workers' KV events, which travel over NATS: add --nats-url "
            "nats://HOST:PORT, or --no-kv-events for approximate mode"
        )
    if args.router_replica_sync and args.router_mode != "kv":
        raise ConfigError(
            f"--router-replica-sync shares the KV router's decisions: add --router-mode kv (not {args.router_mode})"
        )
    if args.router_replica_sync and not args.nats_url and args.discovery != "memory":
        raise ConfigError(
            "--router-replica-sync sends routing decisions over the event plane, NATS: add --nats-url nats://HOST:PORT"
        )
    if args.static_endpoint is None:
        if args.discovery == "memory" and not args.static:
            raise ConfigError(
                "a frontend on its own finds workers through etcd: add --discovery etcd://HOST:PORT, or use "
                "static mode (--static-endpoint ns.comp.ep --model-name NAME --model-path DIR); to run frontend "
                "and worker in one process use `python -m dynamo_nb run --in http --out hf`"
            )
        if args.model_name is not None or args.model_path is not None:
            raise ConfigError(
                "--model-name/--model-path are for static mode: add --static-endpoint ns.comp.ep, or drop "
                "them (with discovery the workers' model cards name the model)"
            )
        if args.static_address is not None:
            raise ConfigError("--static-address is for static mode: add --static-endpoint ns.comp.ep")
        return
    try:
        EndpointPath.parse(args.static_endpoint)
    except ConfigError as exc:
        raise ConfigError(
            f"--static-endpoint {args.static_endpoint!r} is not namespace.component.endpoint "
            f"(e.g. {DEFAULT_WORKER_ENDPOINT}): {exc}"
        ) from None
    missing = [
        flag
        for flag, value in (("--model-name", args.model_name), ("--model-path", args.model_path))
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"--static-endpoint needs {' and '.join(missing)}: with no discovery the frontend builds the model "
            "card itself (e.g. --model-name tiny-llama --model-path DIR)"
        )
    if not args.model_name.strip():
        raise ConfigError("--model-name is empty: give the name clients will send as 'model'")
    check_model_dir(args.model_path, flag="--model-path")
    if args.discovery not in ("memory", "static"):
        raise ConfigError(f"--static-endpoint runs without discovery: drop --discovery {args.discovery}")
    plane = args.request_plane or ("nats" if args.nats_url else "tcp")
    if plane == "nats" and not args.nats_url:
        raise ConfigError("static mode on NATS needs --nats-url nats://HOST:PORT")
    if plane == "tcp" and args.static_address is None:
        raise ConfigError(
            "static mode on TCP needs the worker's address: --static-address tcp://HOST:PORT "
            "(or use NATS: --nats-url nats://HOST:PORT)"
        )
    if plane == "inproc":
        raise ConfigError("static mode reaches a worker in another process: use --request-plane nats or tcp")
