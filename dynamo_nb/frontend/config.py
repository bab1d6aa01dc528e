"""The frontend's settings, declared once: each field of `FrontendConfig` carries its flag,
help, ``DYN_NB_*`` variable and check (`dynamo_nb.settings`), so the frontend's parser, the
config built from it and `dynamo_nb.frontend.Frontend.start`'s keywords all come from here.
`check_frontend_args` refuses the combinations of a frontend program's flags that involve
other configs (the runtime's discovery and NATS), before anything starts.

Example:
    >>> from dynamo_nb.flags import frontend_parser
    >>> config = FrontendConfig.from_args(frontend_parser().parse_args(["--router-mode", "kv"]))
    >>> config.port, config.router_mode, config.kv.policy.prefill_load_scale, config.migration_limit
    (8000, 'kv', 1.0, 3)
    >>> FrontendConfig(migration_limit=-1)
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: migration_limit (--migration-limit) must be at least 0 (off), got -1
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace

from ..errors import ConfigError
from ..http.connections import DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS
from ..llm.card import check_model_dir
from ..llm.tool_calls import TOOL_CALL_PARSERS
from ..router import ROUTER_MODES
from ..router.kv.router import KvRouterConfig
from ..runtime.names import DEFAULT_WORKER_ENDPOINT, EndpointPath
from ..settings import Settings, at_least, greater_than, nested, setting
from .admission import DEFAULT_QUEUE_TIMEOUT
from .migration import DEFAULT_MIGRATION_LIMIT
from .watchdog import WatchdogConfig

__all__ = ["DEFAULT_HTTP_PORT", "FrontendConfig", "check_frontend_args"]

DEFAULT_HTTP_PORT = 8000
_HTTP = "http"
_MODEL = "model (static mode)"


def _port(value: int) -> str | None:
    return None if 0 <= value <= 65535 else "must be a port, 0 (a free one) to 65535"


def _endpoint_path(value: str) -> str | None:
    try:
        EndpointPath.parse(value)
    except ConfigError as exc:
        return f"is not namespace.component.endpoint (e.g. {DEFAULT_WORKER_ENDPOINT}): {exc}"
    return None


@dataclass(frozen=True)
class FrontendConfig(Settings):
    """What a frontend serves and how: each field is one of the frontend program's flags (its
    help says what it does); `Frontend.start(runtime, config, **overrides)` takes one, or
    builds it from the keywords.

    Example:
        >>> FrontendConfig(port=0, router_mode="kv").shares_port
        False
    """

    host: str = setting(
        "127.0.0.1", flag="--http-host", env="HTTP_HOST", group=_HTTP, help="frontend listen host"
    )
    port: int = setting(
        DEFAULT_HTTP_PORT,
        flag="--http-port",
        env="HTTP_PORT",
        group=_HTTP,
        check=_port,
        help="frontend port, 0 = free",
    )
    header_timeout: float = setting(
        DEFAULT_HEADER_TIMEOUT,
        flag="--http-header-timeout",
        group=_HTTP,
        check=greater_than(0, "seconds"),
        help="seconds a new connection has to send its request's headers; a slower one is closed",
    )
    idle_timeout: float = setting(
        DEFAULT_IDLE_TIMEOUT,
        flag="--http-idle-timeout",
        group=_HTTP,
        check=greater_than(0, "seconds"),
        help="seconds a keep-alive connection may stay idle between requests",
    )
    max_connections: int = setting(
        DEFAULT_MAX_CONNECTIONS,
        flag="--http-max-connections",
        group=_HTTP,
        check=at_least(1),
        help="open connections at most; one more gets a 503 and is closed",
    )
    http_workers: int = setting(
        1,
        flag="--http-workers",
        env="HTTP_WORKERS",
        check=at_least(1),
        help="frontend processes sharing --http-port (SO_REUSEPORT), each with its own routers, all fed "
        "by the same discovery and KV events: a frontend that uses more than one core",
    )
    reuse_port: bool = setting(
        False,
        flag="--http-reuse-port",
        hidden=True,
        help="listen with SO_REUSEPORT (set on the replicas of --http-workers)",
    )
    router_mode: str = setting(
        "round-robin",
        flag="--router-mode",
        env="ROUTER_MODE",
        choices=ROUTER_MODES,
        help="how requests pick a worker instance; least-loaded: the less busy of two at random (skipping "
        "workers at their --max-num-seqs); kv: by KV cache overlap and load",
    )
    router_policy: str | None = setting(
        None,
        flag="--router-policy",
        metavar="FILE[:NAME]",
        default_text="off",
        help="route with a RoutingPolicy of your own: FILE is a .py file or a notebook (its export), NAME "
        "the policy's variable (default: the file's one RoutingPolicy); replaces --router-mode",
    )
    kv: KvRouterConfig = nested(KvRouterConfig)
    tool_call_parser: str | None = setting(
        None,
        flag="--tool-call-parser",
        env="TOOL_CALL_PARSER",
        choices=TOOL_CALL_PARSERS,
        default_text="off",
        help="serve tools on chat completions, reading the calls the model writes in this format (hermes: "
        "<tool_call>{...}</tool_call>, as the built-in tiny model's template asks; llama3_json, mistral, "
        "qwen3_coder); off: tools are a 400",
    )
    server_load_interval: float = setting(
        1.0,
        flag="--server-load-interval",
        env="SERVER_LOAD_INTERVAL",
        check=at_least(0, "0 (off)"),
        help="seconds between two asks of each worker's stats for the load its own server reports (upstream "
        "workers in front of vllm serve and the like), which least-loaded and kv routing add to what they "
        "routed; 0: off",
    )
    admin_api: bool = setting(
        False,
        flag="--admin-api",
        default_text="off",
        help="serve the admin routes (GET/PATCH /router_policy), signed with the cluster secret "
        "(DYN_NB_CLUSTER_SECRET or --cluster-secret-file) or with --admin-token-file's token",
    )
    admin_token_file: str | None = setting(
        None,
        flag="--admin-token-file",
        metavar="FILE",
        default_text="off",
        help="the admin routes' bearer token (its first line, 16 characters or more); turns them on",
    )
    router_policy_group: str | None = setting(
        None,
        flag="--router-policy-group",
        env="ROUTER_POLICY_GROUP",
        metavar="NAME",
        default_text="none; --http-workers N with the admin API makes one for its N",
        help="share KV router policy changes with the other frontends of this group over the event plane "
        "(needs --nats-url): a PATCH /router_policy reaching one changes them all",
    )
    static_endpoint: str | None = setting(
        None,
        flag="--static-endpoint",
        check=_endpoint_path,
        default_text="off, models come from discovery",
        help="static mode: serve the model at this worker endpoint (ns.comp.ep) with no discovery; "
        "needs --model-name and --model-path",
    )
    enforce_disagg: bool = setting(
        False,
        flag="--enforce-disagg",
        default_text="off, it falls back with a warning",
        help="with prefill workers, never fall back to aggregated serving: a failed prefill is a 503",
    )
    max_queue: int | None = setting(
        None,
        flag="--max-queue",
        env="MAX_QUEUE",
        check=at_least(0, "0"),
        default_text="no bound, a wait ends after --queue-timeout",
        help="requests of a model that may wait at the frontend while its workers are full (their "
        "--max-num-seqs); beyond, a 503 with Retry-After at once",
    )
    queue_timeout: float = setting(
        DEFAULT_QUEUE_TIMEOUT,
        flag="--queue-timeout",
        env="QUEUE_TIMEOUT",
        check=greater_than(0, "seconds"),
        help="seconds a request may wait at the frontend for a slot while its model's workers are full; "
        "then it is refused",
    )
    overload_status: int = setting(
        503,
        flag="--overload-status",
        env="OVERLOAD_STATUS",
        choices=(503, 529),
        help="the HTTP status of a request refused because a limit was hit: 503, or 529 as Dynamo answers",
    )
    routing_records: int = setting(
        1024,
        flag="--routing-records",
        env="ROUTING_RECORDS",
        check=at_least(0, "0 (keep none)"),
        help="routing decisions the frontend keeps (why each request went where it did), newest last; "
        "0: none kept, a request can still ask for its own with nvext.extra_fields ['routing']",
    )
    request_trace: str | None = setting(
        None,
        flag="--request-trace",
        env="REQUEST_TRACE",
        metavar="PATH",
        default_text="off",
        help="append one JSON line per finished request to PATH (Dynamo's dynamo.request.trace.v1: arrival, "
        "lengths, the prompt's block hashes, TTFT, ITL, workers), for bench.read_trace, replay and planning",
    )
    migration_limit: int = setting(
        DEFAULT_MIGRATION_LIMIT,
        flag="--migration-limit",
        env="MIGRATION_LIMIT",
        check=at_least(0, "0 (off)"),
        help="times a request whose worker goes down mid-stream is carried on by another worker (the "
        "client sees one stream); 0: never, the stream ends with an error",
    )
    watchdog: WatchdogConfig = nested(WatchdogConfig)
    static_address: str | None = setting(
        None,
        flag="--static-address",
        default_text="none",
        help="static mode on the TCP plane: the worker's tcp://HOST:PORT, as it prints it",
    )
    model_path: str | None = setting(
        None,
        flag="--model-path",
        group=_MODEL,
        default_text="none",
        help="static mode: the model's local Hugging Face folder (tokenizer, chat template)",
    )
    model_name: str | None = setting(
        None,
        flag="--model-name",
        group=_MODEL,
        default_text="none",
        help="static mode: the name clients send as 'model'",
    )

    def _check(self) -> None:
        if self.request_trace is not None and not isinstance(self.request_trace, str):
            object.__setattr__(self, "request_trace", os.fspath(self.request_trace))  # a Path given
        if self.model_path is not None and not isinstance(self.model_path, str):
            object.__setattr__(self, "model_path", os.fspath(self.model_path))
        if self.router_policy and self.router_mode != "round-robin":
            raise ConfigError(
                f"--router-policy routes with your policy instead of --router-mode {self.router_mode}: "
                "give one of the two"
            )
        if self.kv.replica_sync and self.router_mode != "kv":
            raise ConfigError(
                f"--router-replica-sync shares the KV router's decisions: add --router-mode kv (not {self.router_mode})"
            )
        if self.static_endpoint is None:
            if self.model_name is not None or self.model_path is not None:
                raise ConfigError(
                    "--model-name/--model-path are for static mode: add --static-endpoint ns.comp.ep, or drop "
                    "them (with discovery the workers' model cards name the model)"
                )
            if self.static_address is not None:
                raise ConfigError("--static-address is for static mode: add --static-endpoint ns.comp.ep")
            return
        missing = [
            flag
            for flag, value in (("--model-name", self.model_name), ("--model-path", self.model_path))
            if value is None
        ]
        if missing:
            raise ConfigError(
                f"--static-endpoint needs {' and '.join(missing)}: with no discovery the frontend builds the model "
                "card itself (e.g. --model-name tiny-llama --model-path DIR)"
            )
        if self.model_name is not None and not self.model_name.strip():
            raise ConfigError("--model-name is empty: give the name clients will send as 'model'")

    @property
    def shares_port(self) -> bool:
        """Whether it listens with ``SO_REUSEPORT``: it has replicas (``--http-workers`` above 1)
        or is one."""
        return self.reuse_port or self.http_workers > 1

    def kv_settings(self, nats: bool) -> KvRouterConfig:
        """The KV router's settings for a frontend with (``nats``) or without an event plane
        across processes: where ``--router-replica-sync`` was not given, the processes of
        ``--http-workers N`` (or a replica of them) share their decisions when they have one.

        Example:
            >>> FrontendConfig(http_workers=2).kv_settings(nats=True).replica_sync
            True
        """
        if self.kv.replica_sync is not None:
            return self.kv
        return replace(self.kv, replica_sync=self.shares_port and nats)

    @property
    def admin_enabled(self) -> bool:
        """Whether the admin routes are on: ``--admin-api``, or a token file given."""
        return self.admin_api or self.admin_token_file is not None


def check_frontend_args(args: argparse.Namespace) -> FrontendConfig:
    """The config a frontend program's flags give (`FrontendConfig.from_args`: each flag
    checked), with the combinations that involve the runtime's flags (discovery, NATS) refused
    before anything starts, naming the flag and the fix (no file is read: ``--router-policy`` is
    loaded by `dynamo_nb.notebook.component_program.load_router_policy`).

    Example:
        >>> from dynamo_nb.flags import frontend_parser
        >>> check_frontend_args(frontend_parser().parse_args([]))
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: a frontend on its own finds workers through etcd: add --discovery etcd://HOST:PORT, ...
    """
    nats, discovery = args.nats_url, args.discovery
    if args.static_endpoint is None and discovery == "memory" and not args.static:
        raise ConfigError(
            "a frontend on its own finds workers through etcd: add --discovery etcd://HOST:PORT, or use "
            "static mode (--static-endpoint ns.comp.ep --model-name NAME --model-path DIR); to run frontend "
            "and worker in one process use `python -m dynamo_nb run --in http --out hf`"
        )
    config = FrontendConfig.from_args(args)
    if config.router_policy_group and not nats:
        raise ConfigError(
            "--router-policy-group shares policy changes over the event plane: add --nats-url nats://HOST:PORT"
        )
    if config.admin_enabled and config.http_workers > 1 and not nats:
        raise ConfigError(
            "the admin API with --http-workers N shares a policy change between the N processes over "
            "the event plane: add --nats-url nats://HOST:PORT, or use --http-workers 1"
        )
    if config.router_mode == "kv" and config.kv.use_kv_events and not nats and discovery != "memory":
        raise ConfigError(
            "--router-mode kv follows the workers' KV events, which travel over NATS: add --nats-url "
            "nats://HOST:PORT, or --no-kv-events for approximate mode"
        )
    if config.kv.replica_sync and not nats and discovery != "memory":
        raise ConfigError(
            "--router-replica-sync sends routing decisions over the event plane, NATS: add --nats-url nats://HOST:PORT"
        )
    if config.static_endpoint is None:
        return config
    if config.model_path is not None:  # FrontendConfig requires it in static mode
        check_model_dir(config.model_path, flag="--model-path")
    if discovery not in ("memory", "static"):
        raise ConfigError(f"--static-endpoint runs without discovery: drop --discovery {discovery}")
    plane = args.request_plane or ("nats" if nats else "tcp")
    if plane == "nats" and not nats:
        raise ConfigError("static mode on NATS needs --nats-url nats://HOST:PORT")
    if plane == "tcp" and config.static_address is None:
        raise ConfigError(
            "static mode on TCP needs the worker's address: --static-address tcp://HOST:PORT "
            "(or use NATS: --nats-url nats://HOST:PORT)"
        )
    if plane == "inproc":
        raise ConfigError("static mode reaches a worker in another process: use --request-plane nats or tcp")
    return config
