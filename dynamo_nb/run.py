"""``python -m dynamo_nb run --in ... --out ...``: frontend and/or worker, as dynamo-run does.

=============================  ===============================================================
``--in http --out hf``         frontend + hf worker in one process (memory discovery, inproc);
                               nothing else to start. ``--out echo``: a zero-cost echo engine;
                               ``--out mocker``: a simulated one (Dynamo's timing model)
``--in http --out upstream=URL``
                               frontend + a running OpenAI-compatible server at ``URL``
                               (``vllm serve`` …) behind it, as an engine (`UpstreamEngine`)
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
import functools
import sys
from typing import TYPE_CHECKING, Any

from . import flags
from .errors import ConfigError
from .runtime.distributed import DistributedRuntime
from .runtime.names import EndpointPath
from .runtime.program import announce_ready, configure_logging, kit_runtime_from_args, shutdown_on_signals

if TYPE_CHECKING:
    from .router.function import PickFunction

__all__ = ["run", "run_parser"]

ENGINES = ("hf", "echo", "mocker")
UPSTREAM = "upstream="  # --out upstream=URL: a running OpenAI-compatible server


def run_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m dynamo_nb run``: ``--in``/``--out`` plus the components' own."""
    parser = flags.component_parser(
        "python -m dynamo_nb run",
        __doc__,
        flags.add_model_args,  # the worker's (from DYN_NB_MODEL_PATH too), and static mode's
        flags.add_frontend_args,
        flags.add_engine_args,
        flags.add_hf_args,
        _add_mocker_args,
    )
    parser.add_argument(
        "--in", dest="input", default="http", help="http | dyn://ns.comp.ep (default: %(default)s)"
    )
    parser.add_argument(
        "--out",
        dest="output",
        default="hf",
        help="hf | echo | mocker | upstream=http://HOST:PORT (a running server) | dyn://ns.comp.ep "
        "(default: %(default)s)",
    )
    return parser


def _add_mocker_args(parser: argparse.ArgumentParser) -> None:
    """``--out mocker``'s own flags (the KV pool and the speed; the flags the hf engine takes too,
    such as ``--max-num-batched-tokens``, keep the hf engine's defaults)."""
    from .engines.mocker import MockerWorkerSettings
    from .settings import add_settings

    own = ("num_blocks", "speedup_ratio", "decode_speedup_ratio", "context_length")
    add_settings(parser, MockerWorkerSettings, "mocker engine (--out mocker)", only=own)


def _dyn_path(value: str, flag: str) -> EndpointPath | None:
    if not value.startswith("dyn://"):
        return None
    try:
        return EndpointPath.parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{flag} {value!r}: {exc}") from None


async def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run until SIGINT/SIGTERM."""
    from .frontend.config import check_frontend_args
    from .notebook.component_program import load_router_policy

    argv = sys.argv[1:] if argv is None else list(argv)
    args = run_parser().parse_args(argv)
    configure_logging(args.log_level)
    in_path = _dyn_path(args.input, "--in")
    out_path = _dyn_path(args.output, "--out")
    if args.input != "http" and in_path is None:
        raise ConfigError(f"--in {args.input!r}: use http or dyn://namespace.component.endpoint")
    if args.output not in ENGINES and out_path is None and not args.output.startswith(UPSTREAM):
        raise ConfigError(
            f"--out {args.output!r}: use {', '.join(ENGINES)}, upstream=http://HOST:PORT or "
            "dyn://namespace.component.endpoint"
        )
    if in_path is not None and out_path is not None:
        raise ConfigError("--in dyn://... serves an engine: give --out hf or --out echo")
    if args.output == "echo" and args.mode != "aggregated":
        raise ConfigError(f"--out echo has no prefill or decode role: drop --mode {args.mode}")
    if in_path is not None:
        args.endpoint = str(in_path)
    if out_path is not None:  # frontend only
        if args.static:
            args.static_endpoint = str(out_path)
        check_frontend_args(args)
    elif in_path is None and args.discovery != "memory":
        raise ConfigError(
            "--in http --out ENGINE runs in one process with memory discovery: drop --discovery"
        )
    if in_path is None and out_path is None and args.http_workers > 1:
        raise ConfigError(
            f"--http-workers {args.http_workers} starts more frontend processes on one port, and --out "
            f"{args.output} runs its engine in this one (each would start its own): serve the engine "
            f"apart (--in dyn://NS.COMP.EP --out {args.output}) and give this frontend --out dyn://NS.COMP.EP"
        )

    # --router-policy FILE[:NAME]: loaded (and checked) before anything starts
    policy = load_router_policy(args.router_policy) if in_path is None and args.router_policy else None
    runtime = await kit_runtime_from_args(args, static=args.static_endpoint is not None)
    closers: list[Any] = []
    try:
        shutdown_on_signals(runtime)  # from the start: READY lines below are true once printed
        model_name = None
        if out_path is None:
            model_name = await _start_worker(runtime, args, closers)
        if in_path is None:
            await _start_frontend(runtime, args, argv, policy, out_path, closers, wait_for=model_name)
        await runtime.wait_closed()
    finally:
        for close in reversed(closers):
            await close()
        await runtime.shutdown()
    return 0


async def _start_worker(runtime: DistributedRuntime, args: argparse.Namespace, closers: list[Any]) -> str:
    """Start the engine worker (it prints its READY line); returns the model name."""
    from .disagg.modes import WorkerRole
    from .engines import EchoEngine
    from .engines.engine_worker import serve_engine
    from .llm.register import model_from_args

    model_path, model_name = model_from_args(args)
    upstream = None
    if args.output.startswith(UPSTREAM):  # connected first: it names the model unless --model-name
        from .engines.upstream import UpstreamEngine
        from .llm.tokenizer import ModelTokenizer

        upstream = await UpstreamEngine.connect(
            args.output.removeprefix(UPSTREAM), tokenizer=ModelTokenizer.load(model_path)
        )
        model_name = args.model_name or upstream.model

    async def make_engine(kv_events: Any) -> Any:
        if upstream is not None:
            return upstream
        if args.output == "echo":
            return await EchoEngine.from_args(args, model_path)
        if args.output == "mocker":
            from .engines.mocker import MockerEngine

            return await MockerEngine.from_args(args, model_path, kv_events=kv_events)
        from .engines.hf import HFEngine

        return await HFEngine.from_args(args, model_path, kv_events=kv_events)

    worker = await serve_engine(runtime, WorkerRole.from_args(args), model_path, model_name, make_engine)
    closers.append(worker.engine.close)
    if upstream is not None:  # in discovery only while the server answers
        watching = upstream.watch(worker.server)

        async def stop_watching() -> None:
            watching.cancel()

        closers.append(stop_watching)
    worker.announce()
    return worker.model_name


async def _start_frontend(
    runtime: DistributedRuntime,
    args: argparse.Namespace,
    argv: list[str],
    policy: PickFunction | None,
    out_path: EndpointPath | None,
    closers: list[Any],
    wait_for: str | None,
) -> None:
    """Start the frontend, and its replicas with ``--http-workers N`` (this command again, ``argv``,
    on its port); prints its READY line once ``wait_for`` (the in-process model) is served."""
    from .frontend import Frontend, FrontendConfig
    from .frontend.replicas import start_frontend_replicas, stop_http_replicas

    only = str(out_path) if out_path is not None and not runtime.is_static else None
    # the model flags are the in-process worker's unless the frontend serves one in static mode
    static = {} if args.static_endpoint is not None else {"model_name": None, "model_path": None}
    config = FrontendConfig.from_args(args, **static)
    frontend = await Frontend.start(runtime, config, router_policy=policy, only_endpoint=only)
    closers.append(frontend.stop)
    replicas = await start_frontend_replicas(frontend, "-m", ["dynamo_nb", "run", *argv])
    closers.append(functools.partial(stop_http_replicas, replicas))
    if wait_for is not None:
        await frontend.wait_for_model(wait_for, timeout=30)
    models = ",".join(m.name for m in frontend.models.live_models())
    announce_ready("frontend", url=frontend.url, **({"models": models} if models else {}))
