"""Command-line flags shared by every component (DESIGN.md §4b): one definition, reused.

Each flag may take its default from a ``DYN_NB_*`` environment variable; a flag given on
the command line always wins, and ``--help`` shows every default.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_runtime_args(parser)
    >>> args = parser.parse_args(["--discovery", "etcd://127.0.0.1:2379"])
    >>> args.discovery, args.request_plane
    ('etcd://127.0.0.1:2379', None)
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._names import EndpointPath
from .discovery import DEFAULT_LEASE_TTL
from .errors import ConfigError
from .runtime import DistributedRuntime

if TYPE_CHECKING:
    from ._server import EndpointServer, Handler
    from .engines.hf import HFEngine
    from .kv.router import KvRouterConfig
    from .llm.card import ModelCard
    from .runtime import Endpoint

__all__ = [
    "DEFAULT_WORKER_ENDPOINT",
    "WorkerRole",
    "add_disagg_args",
    "add_endpoint_arg",
    "add_frontend_args",
    "add_http_args",
    "add_mocker_args",
    "add_model_args",
    "add_runtime_args",
    "add_worker_args",
    "frontend_parser",
    "hf_engine_from_args",
    "hf_worker_parser",
    "kv_config_from_args",
    "mocker_worker_parser",
    "model_name_from_args",
    "model_path_from_args",
    "role_from_args",
    "runtime_from_args",
    "serve_model_from_args",
    "validate_frontend_args",
]

DEFAULT_WORKER_ENDPOINT = "dynamo.backend.generate"
DEFAULT_PREFILL_ENDPOINT = "dynamo.prefill.generate"
WORKER_MODES = ("aggregated", "prefill", "decode")


def _env(name: str, default: str | None) -> str | None:
    return os.environ.get(f"DYN_NB_{name}", default)


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--discovery``, ``--request-plane``, ``--nats-url``, ``--lease-ttl``, ``--static``."""
    group = parser.add_argument_group("runtime")
    group.add_argument(
        "--discovery",
        default=_env("DISCOVERY", "memory"),
        help="discovery backend: memory | etcd://HOST:PORT | static (env DYN_NB_DISCOVERY; default: %(default)s)",
    )
    group.add_argument(
        "--request-plane",
        choices=("inproc", "tcp", "nats"),
        default=_env("REQUEST_PLANE", None),
        help="request plane (env DYN_NB_REQUEST_PLANE; default: inproc with memory discovery, tcp with etcd, "
        "nats for --static with --nats-url)",
    )
    group.add_argument(
        "--nats-url",
        default=_env("NATS_URL", None),
        help="NATS server, nats://HOST:PORT (env DYN_NB_NATS_URL; default: %(default)s)",
    )
    group.add_argument(
        "--lease-ttl",
        type=float,
        default=float(_env("LEASE_TTL", str(DEFAULT_LEASE_TTL)) or DEFAULT_LEASE_TTL),
        help="seconds after which a dead worker leaves etcd (default: %(default)s)",
    )
    group.add_argument(
        "--static",
        action="store_true",
        help="static mode: no discovery service; serve at the subject derived from the endpoint path (NATS) "
        "or at --tcp-port (same as --discovery static)",
    )
    group.add_argument(
        "--tcp-host",
        default=_env("TCP_HOST", "127.0.0.1"),
        help="TCP plane listen host (default: %(default)s)",
    )
    group.add_argument(
        "--tcp-port",
        type=int,
        default=int(_env("TCP_PORT", "0") or 0),
        help="TCP plane port, 0 = free (default: %(default)s)",
    )


def add_endpoint_arg(parser: argparse.ArgumentParser, default: str) -> None:
    """Add ``--endpoint ns.comp.ep`` with ``default``."""
    parser.add_argument(
        "--endpoint",
        default=_env("ENDPOINT", default),
        help="endpoint to serve, ns.comp.ep (default: %(default)s)",
    )


async def runtime_from_args(args: argparse.Namespace) -> DistributedRuntime:
    """Create the runtime the flags describe (``--static`` or ``--static-endpoint``: no discovery)."""
    static = args.static or getattr(args, "static_endpoint", None) is not None
    return await DistributedRuntime.create(
        "static" if static else args.discovery,
        args.request_plane,
        args.nats_url,
        lease_ttl=args.lease_ttl,
        tcp_host=args.tcp_host,
        tcp_port=args.tcp_port,
    )


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--model-path`` (default: the built-in tiny model) and ``--model-name``."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model-path",
        default=_env("MODEL_PATH", None),
        help="local Hugging Face model folder (env DYN_NB_MODEL_PATH; default: the built-in tiny model)",
    )
    group.add_argument(
        "--model-name",
        default=_env("MODEL_NAME", None),
        help="name the model is served as (env DYN_NB_MODEL_NAME; default: the folder's name, "
        "tiny-llama for the built-in model)",
    )


def add_http_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--http-host`` and ``--http-port``."""
    group = parser.add_argument_group("http")
    group.add_argument(
        "--http-host",
        default=_env("HTTP_HOST", "127.0.0.1"),
        help="frontend listen host (default: %(default)s)",
    )
    group.add_argument(
        "--http-port",
        type=int,
        default=int(_env("HTTP_PORT", "8000") or 8000),
        help="frontend port, 0 = free (env DYN_NB_HTTP_PORT; default: %(default)s)",
    )


def add_frontend_args(parser: argparse.ArgumentParser) -> None:
    """Add the frontend's own flags: HTTP address, ``--router-mode`` and static mode."""
    add_http_args(parser)
    group = parser.add_argument_group("frontend")
    group.add_argument(
        "--router-mode",
        choices=("round-robin", "random", "kv"),
        default=_env("ROUTER_MODE", "round-robin"),
        help="how requests pick a worker instance; kv: by KV cache overlap and load (default: %(default)s)",
    )
    group.add_argument(
        "--kv-overlap-score-weight",
        type=float,
        default=1.0,
        help="kv router: weight of the prefill blocks against the decode blocks in a worker's cost "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--router-temperature",
        type=float,
        default=0.0,
        help="kv router: 0 picks the cheapest worker, more samples by a softmax of the costs (default: %(default)s)",
    )
    group.add_argument(
        "--no-kv-events",
        action="store_true",
        help="kv router: approximate mode, no KV events; routed blocks count as cached for a while (default: off)",
    )
    group.add_argument(
        "--static-endpoint",
        default=None,
        help="static mode: serve the model at this worker endpoint (ns.comp.ep) with no discovery; "
        "needs --model-name and --model-path (default: off, models come from discovery)",
    )
    group.add_argument(
        "--enforce-disagg",
        action="store_true",
        help="with prefill workers, never fall back to aggregated serving: a failed prefill is a 503 "
        "(default: off, it falls back with a warning)",
    )
    group.add_argument(
        "--static-address",
        default=None,
        help="static mode on the TCP plane: the worker's tcp://HOST:PORT, as it prints it (default: none)",
    )


def add_worker_args(parser: argparse.ArgumentParser, default_endpoint: str = DEFAULT_WORKER_ENDPOINT) -> None:
    """Add what an engine worker takes: ``--endpoint``, ``--mode`` and the engine settings."""
    add_endpoint_arg(parser, default_endpoint)
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--device",
        default=_env("DEVICE", "auto"),
        help="auto (CUDA when present) | cpu | cuda[:N] (default: %(default)s)",
    )
    group.add_argument(
        "--dtype", default="auto", help="auto | float32 | float16 | bfloat16 (default: %(default)s)"
    )
    group.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="requests running at once; more wait (default: %(default)s)",
    )
    group.add_argument(
        "--kv-cache-block-size",
        type=int,
        default=16,
        help="KV block size published in the model card (default: %(default)s)",
    )
    group.add_argument(
        "--prefix-cache-blocks",
        type=int,
        default=1024,
        help="full prompt blocks whose KV is kept for reuse by later prompts, with KV events for "
        "KV routing (default: %(default)s)",
    )
    group.add_argument(
        "--no-enable-prefix-caching",
        action="store_true",
        help="no prefix cache, as --prefix-cache-blocks 0 (default: off, prefix caching on)",
    )
    add_disagg_args(parser)


def add_disagg_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--mode`` and the disaggregated-serving flags (an engine worker's role)."""
    disagg = parser.add_argument_group("disaggregated serving")
    disagg.add_argument(
        "--mode",
        choices=WORKER_MODES,
        default="aggregated",
        help="worker role: aggregated (prefill + decode), prefill (serves at --prefill-endpoint, parks "
        "KV caches in its bootstrap server) or decode (serves at --endpoint, fetches them) "
        "(default: %(default)s)",
    )
    disagg.add_argument(
        "--prefill-endpoint",
        default=DEFAULT_PREFILL_ENDPOINT,
        help="where prefill workers serve; a decode worker asks one itself when a request comes "
        "without bootstrap info (default: %(default)s)",
    )
    disagg.add_argument(
        "--bootstrap-host",
        default=_env("BOOTSTRAP_HOST", "127.0.0.1"),
        help="prefill: address of the bootstrap server decode workers fetch KV caches from "
        "(default: %(default)s)",
    )
    disagg.add_argument(
        "--bootstrap-port", type=int, default=0, help="prefill: its port (default: 0, a free one)"
    )
    disagg.add_argument(
        "--no-bootstrap-endpoint",
        action="store_true",
        help="prefill: do not publish the bootstrap server as disaggregated_endpoint, so routers take "
        "the fallback path (wait for disaggregated_params), as with engines that have none (default: off)",
    )
    disagg.add_argument(
        "--kv-ttl",
        type=float,
        default=60.0,
        help="prefill: seconds a parked KV cache waits for its decode before it is dropped (default: %(default)s)",
    )
    disagg.add_argument(
        "--kv-timeout",
        type=float,
        default=30.0,
        help="decode: seconds to wait for a prefill's KV cache (default: %(default)s)",
    )


def add_mocker_args(parser: argparse.ArgumentParser) -> None:
    """Add the mocker engine's flags (its simulated scheduler, KV pool and timing)."""
    add_endpoint_arg(parser, DEFAULT_WORKER_ENDPOINT)
    group = parser.add_argument_group("mocker")
    group.add_argument(
        "--num-workers",
        type=int,
        default=1,
        help="engines in this process, each its own instance (default: %(default)s)",
    )
    group.add_argument(
        "--kv-cache-block-size", type=int, default=16, help="tokens per KV block (default: %(default)s)"
    )
    group.add_argument(
        "--num-gpu-blocks", type=int, default=16384, help="KV blocks per engine (default: %(default)s)"
    )
    group.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="token budget of a step (default: %(default)s)",
    )
    group.add_argument(
        "--max-num-seqs", type=int, default=256, help="requests running at once (default: %(default)s)"
    )
    group.add_argument(
        "--speedup-ratio",
        type=float,
        default=1.0,
        help="divide every simulated step time by this (default: %(default)s)",
    )
    group.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="longest prompt + output published in the model card (default: the model folder's)",
    )
    add_disagg_args(parser)


def _component_parser(prog: str, description: str | None, *add_groups: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_args(parser)
    for add in add_groups:
        add(parser)  # type: ignore[operator]
    parser.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    return parser


def hf_worker_parser(prog: str = "hf_worker", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the ``hf`` engine worker (components/hf_worker.py)."""
    return _component_parser(prog, description, add_model_args, add_worker_args)


def mocker_worker_parser(
    prog: str = "mocker_worker", description: str | None = None
) -> argparse.ArgumentParser:
    """Every flag of the mocker engine worker (components/mocker_worker.py)."""
    return _component_parser(prog, description, add_model_args, add_mocker_args)


def frontend_parser(prog: str = "frontend", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the OpenAI frontend (components/frontend.py)."""
    return _component_parser(prog, description, add_frontend_args, add_model_args)


def model_path_from_args(args: argparse.Namespace) -> Path:
    """``--model-path`` checked, or the built-in tiny model (built on first use)."""
    from .llm.card import check_model_dir

    if args.model_path is None:
        from .models import tiny_model_path

        return tiny_model_path()
    return check_model_dir(args.model_path, flag="--model-path")


def model_name_from_args(args: argparse.Namespace, model_path: Path) -> str:
    """``--model-name``, or the model folder's name (``tiny-llama`` for the built-in model)."""
    if args.model_name is not None:
        if not args.model_name.strip():
            raise ConfigError("--model-name is empty: give a name such as tiny-llama, or leave the flag out")
        return args.model_name
    if args.model_path is None:
        from .models import TINY_MODEL_NAME

        return TINY_MODEL_NAME
    return model_path.name


def kv_config_from_args(args: argparse.Namespace) -> KvRouterConfig:
    """The KV router settings the frontend flags give."""
    from .kv.router import KvRouterConfig

    if args.router_temperature < 0:
        raise ConfigError(f"--router-temperature must be 0 or more, got {args.router_temperature}")
    return KvRouterConfig(
        overlap_weight=args.kv_overlap_score_weight,
        temperature=args.router_temperature,
        use_kv_events=not args.no_kv_events,
    )


def validate_frontend_args(args: argparse.Namespace) -> None:
    """Reject flag combinations that cannot work, naming the flag and the fix (before anything starts)."""
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
    from .llm.card import check_model_dir

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


async def hf_engine_from_args(args: argparse.Namespace, model_path: Path) -> HFEngine:
    """The ``hf`` engine the worker flags describe (device, dtype, slots, prefix cache)."""
    from .engines.hf import HFEngine

    return await HFEngine.load(
        model_path,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        prefix_cache_blocks=0 if args.no_enable_prefix_caching else args.prefix_cache_blocks,
        block_size=args.kv_cache_block_size,
    )


@dataclass
class WorkerRole:
    """What ``--mode`` makes of an engine: the handler to serve, where, and its model card's
    ``kind`` and ``runtime_config``."""

    handler: Handler
    endpoint_path: str
    kind: list[str] | None = None
    runtime_config: dict[str, Any] | None = None


async def role_from_args(runtime: DistributedRuntime, args: argparse.Namespace, engine: Any) -> WorkerRole:
    """The ``--mode`` role of ``engine`` (an ``HFEngine`` or ``MockerEngine``).

    prefill: starts its bootstrap server, serves ``engine.prefill`` at ``--prefill-endpoint``,
    card kind ``prefill`` with the server as ``disaggregated_endpoint``. decode: a
    `DecodeHandler` at ``--endpoint`` (it asks a prefill worker itself for requests without
    bootstrap info). aggregated: ``engine.generate`` at ``--endpoint``.
    """
    engine.kv_timeout = args.kv_timeout
    if args.mode == "prefill":
        bootstrap = await engine.start_bootstrap(args.bootstrap_host, args.bootstrap_port, ttl=args.kv_ttl)
        published = None if args.no_bootstrap_endpoint else bootstrap.endpoint
        return WorkerRole(
            engine.prefill, args.prefill_endpoint, ["prefill"], {"disaggregated_endpoint": published}
        )
    if args.mode == "decode":
        from .disagg.handlers import DecodeHandler

        try:  # to ask a prefill worker itself for requests that come without bootstrap info
            prefill = await runtime.endpoint(args.prefill_endpoint).client()
        except ConfigError as exc:  # e.g. static TCP: no address for the prefill workers
            logging.getLogger("dynamo_nb.worker").warning(
                "no prefill client (%s): such requests run here", exc
            )
            prefill = None
        return WorkerRole(
            DecodeHandler(engine, prefill).generate, args.endpoint, ["chat", "completions", "decode"]
        )
    return WorkerRole(engine.generate, args.endpoint)


async def serve_model_from_args(
    runtime: DistributedRuntime,
    args: argparse.Namespace,
    handler: Handler,
    model_path: Path,
    *,
    endpoint_path: str | None = None,
    kind: list[str] | None = None,
    runtime_config: dict[str, Any] | None = None,
) -> tuple[Endpoint, EndpointServer, ModelCard]:
    """Serve an engine's ``handler`` at ``endpoint_path`` (default ``--endpoint``) and register
    the model (not with ``--static``) with ``kind`` and ``runtime_config``.

    Prints the worker's ``READY <endpoint> instance=<id> address=<address> model=<name>`` line.
    """
    from .llm.serve import serve_llm

    endpoint = runtime.endpoint(endpoint_path or args.endpoint)
    server, card = await serve_llm(
        endpoint,
        handler,
        model_path,
        model_name=model_name_from_args(args, model_path),
        kind=kind,
        kv_cache_block_size=args.kv_cache_block_size,
        runtime_config=runtime_config,
    )
    print(
        f"READY {endpoint.path} instance={server.instance_id:x} address={server.address} model={card.name}",
        flush=True,
    )
    return endpoint, server, card
