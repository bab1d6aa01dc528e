"""What the frontend's flags mean: their combinations checked, and a frontend started from them.

`validate_frontend_args` refuses, before anything starts, a combination that cannot work,
naming the flag and the fix; `start_frontend` starts the `Frontend` the flags describe (in
static mode, with the one model they name).

Example:
    >>> from dynamo_nb.flags import frontend_parser
    >>> validate_frontend_args(frontend_parser().parse_args([]))
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: a frontend on its own finds workers through etcd: add --discovery etcd://HOST:PORT, ...
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..llm.card import check_model_dir
from ..runtime.names import DEFAULT_WORKER_ENDPOINT, EndpointPath
from .app import Frontend
from .settings import FrontendConfig

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["start_frontend", "validate_frontend_args"]


def validate_frontend_args(args: argparse.Namespace) -> None:
    """Reject flag combinations that cannot work, naming the flag and the fix, then load
    ``--router-policy`` (found, exported and checked): all before anything starts."""
    _check_flag_combinations(args)
    if args.router_policy:
        from ..notebook.programs import load_component

        try:
            load_component(args.router_policy, runnable=False)
        except ConfigError as exc:
            raise ConfigError(f"--router-policy {args.router_policy}: {exc}") from None


def _check_flag_combinations(args: argparse.Namespace) -> None:
    """The cheap checks of `validate_frontend_args` (no file is read)."""
    if args.http_workers < 1:
        raise ConfigError(f"--http-workers must be at least 1, got {args.http_workers}")
    if args.max_queue is not None and args.max_queue < 0:
        raise ConfigError(f"--max-queue must be 0 or more (or left out: no bound), got {args.max_queue}")
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


async def start_frontend(
    runtime: DistributedRuntime, args: argparse.Namespace, *, only_endpoint: str | None = None
) -> Frontend:
    """Start the frontend the flags describe (`FrontendConfig.from_args`, then `FrontendConfig.start`):
    HTTP address, router mode, KV router settings, ``--enforce-disagg``; with ``--static-endpoint``
    it serves the one model the flags name.

    ``only_endpoint``: serve only the models registered at this endpoint (``ns.comp.ep``).
    """
    return await FrontendConfig.from_args(args).start(runtime, only_endpoint=only_endpoint)
