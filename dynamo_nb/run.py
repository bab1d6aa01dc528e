"""``python -m dynamo_nb run --in ... --out ...``: frontend and/or worker, as dynamo-run does.

=============================  ===============================================================
``--in http --out hf``         frontend + hf worker in one process (memory discovery, inproc);
                               nothing else to start. ``--out echo``: a zero-cost echo engine.
``--in http --out dyn://P``    frontend only, serving the models registered at endpoint ``P``
                               (``--discovery etcd://...``; or ``--static`` with the model flags)
``--in dyn://P --out hf``      worker only, serving endpoint ``P`` (runtime flags as any worker)
=============================  ===============================================================

Example::

    python -m dynamo_nb run --in http --out hf --http-port 8000
    curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello!"}]}'
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from . import cli
from ._names import EndpointPath
from .errors import ConfigError
from .runtime import DistributedRuntime
from .worker import shutdown_on_signals

__all__ = ["run", "run_parser"]

ENGINES = ("hf", "echo")


def run_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m dynamo_nb run``: ``--in``/``--out`` plus the components' own."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--in", dest="input", default="http", help="http | dyn://ns.comp.ep (default: %(default)s)"
    )
    parser.add_argument(
        "--out", dest="output", default="hf", help="hf | echo | dyn://ns.comp.ep (default: %(default)s)"
    )
    cli.add_runtime_args(parser)
    cli.add_frontend_args(parser)
    cli.add_model_args(parser)
    cli.add_worker_args(parser)
    parser.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    return parser


def _dyn_path(value: str, flag: str) -> EndpointPath | None:
    if not value.startswith("dyn://"):
        return None
    try:
        return EndpointPath.parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {value!r}: {exc}") from None


async def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run until SIGINT/SIGTERM."""
    args = run_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    in_path = _dyn_path(args.input, "--in")
    out_path = _dyn_path(args.output, "--out")
    if args.input != "http" and in_path is None:
        raise ConfigError(f"--in {args.input!r}: use http or dyn://namespace.component.endpoint")
    if args.output not in ENGINES and out_path is None:
        raise ConfigError(
            f"--out {args.output!r}: use {', '.join(ENGINES)} or dyn://namespace.component.endpoint"
        )
    if in_path is not None and out_path is not None:
        raise ConfigError("--in dyn://... serves an engine: give --out hf or --out echo")
    if in_path is not None:
        args.endpoint = str(in_path)
    if out_path is not None:  # frontend only
        if args.static:
            args.static_endpoint = str(out_path)
        cli.validate_frontend_args(args)
    elif in_path is None and args.discovery != "memory":
        raise ConfigError(
            "--in http --out ENGINE runs in one process with memory discovery: drop --discovery"
        )

    runtime = await cli.runtime_from_args(args)
    closers: list[Any] = []
    try:
        model_name = None
        if out_path is None:
            model_name = await _start_worker(runtime, args, closers)
        if in_path is None:
            await _start_frontend(runtime, args, out_path, closers, wait_for=model_name)
        shutdown_on_signals(runtime)
        await runtime.wait_closed()
    finally:
        for close in reversed(closers):
            await close()
        await runtime.shutdown()
    return 0


async def _start_worker(runtime: DistributedRuntime, args: argparse.Namespace, closers: list[Any]) -> str:
    """Start the engine worker (it prints its READY line); returns the model name."""
    model_path = cli.model_path_from_args(args)
    if args.output == "hf":
        engine: Any = await cli.hf_engine_from_args(args, model_path)
        closers.append(engine.close)
    else:
        from .engines import EchoEngine

        engine = EchoEngine()
    _, _, card = await cli.serve_model_from_args(runtime, args, engine.generate, model_path)
    return card.name


async def _start_frontend(
    runtime: DistributedRuntime,
    args: argparse.Namespace,
    out_path: EndpointPath | None,
    closers: list[Any],
    wait_for: str | None,
) -> None:
    """Start the frontend; prints its READY line once ``wait_for`` (the in-process model) is served."""
    from .frontend import Frontend
    from .llm import card_from_folder

    frontend = await Frontend.start(
        runtime,
        host=args.http_host,
        port=args.http_port,
        router_mode=args.router_mode,
        only_endpoint=str(out_path) if out_path is not None and not runtime.is_static else None,
        enforce_disagg=args.enforce_disagg,
        kv_config=cli.kv_config_from_args(args),
    )
    closers.append(frontend.stop)
    if args.static_endpoint:
        card = card_from_folder(args.model_path, name=args.model_name, endpoint=args.static_endpoint)
        await frontend.add_model(card, address=args.static_address)
    if wait_for is not None:
        await frontend.wait_for_model(wait_for, timeout=30)
    models = (
        ", ".join(m.name for m in frontend.models.live_models()) or "(from discovery, as workers register)"
    )
    print(f"READY frontend {frontend.url} models: {models}", flush=True)
