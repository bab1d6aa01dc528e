"""hf engine worker: a local Hugging Face model (PyTorch + transformers) behind an endpoint.

A plain program: the runtime, the engine, the endpoint, its server and the model card are
the objects you see in ``main``. It serves ``PreprocessedRequest`` → token deltas and
registers its model card so that frontends find it (not with ``--static``).

    python components/hf_worker.py --help
    python components/hf_worker.py --discovery etcd://127.0.0.1:2379            # + frontend.py
    python components/hf_worker.py --static --nats-url nats://127.0.0.1:4222    # static mode
    python components/hf_worker.py --model-path /models/Qwen2.5-0.5B-Instruct --model-name qwen

Disaggregated serving (``--mode``):

    python components/hf_worker.py --mode prefill --discovery etcd://…   # at --prefill-endpoint
    python components/hf_worker.py --mode decode --discovery etcd://…    # at --endpoint

A prefill worker runs a bootstrap server and publishes it as ``disaggregated_endpoint`` in
its runtime config (card kind ``prefill``); it parks each prompt's KV cache there. A decode
worker (card kinds chat, completions, decode) fetches it by ``bootstrap_info`` or
``prefill_result``, and asks a prefill worker itself when a request carries neither.

It prints ``READY <endpoint> instance=<id> address=<address> model=<name>`` once it serves.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import ConfigError, DistributedRuntime
from dynamo_nb.cli import hf_worker_parser, model_path_from_args, runtime_from_args, serve_model_from_args
from dynamo_nb.disagg.handlers import DecodeHandler
from dynamo_nb.engines import HFEngine
from dynamo_nb.worker import run_program, shutdown_on_signals


def build_parser():
    return hf_worker_parser(prog="hf_worker", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    model_path = model_path_from_args(args)  # the built-in tiny model unless --model-path

    runtime: DistributedRuntime = await runtime_from_args(args)
    engine = await HFEngine.load(
        model_path, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs
    )
    engine.kv_timeout = args.kv_timeout
    # the handler and the card of this worker's role
    if args.mode == "prefill":
        bootstrap = await engine.start_bootstrap(args.bootstrap_host, args.bootstrap_port, ttl=args.kv_ttl)
        handler, endpoint_path, kind = engine.prefill, args.prefill_endpoint, ["prefill"]
        runtime_config = {
            "disaggregated_endpoint": None if args.no_bootstrap_endpoint else bootstrap.endpoint
        }
    elif args.mode == "decode":
        try:  # to ask a prefill worker itself for requests that come without bootstrap info
            prefill = await runtime.endpoint(args.prefill_endpoint).client()
        except ConfigError as exc:  # e.g. static TCP: no address for the prefill workers
            logging.getLogger("hf_worker").warning("no prefill client (%s): such requests run here", exc)
            prefill = None
        handler = DecodeHandler(engine, prefill).generate
        endpoint_path, kind, runtime_config = args.endpoint, ["chat", "completions", "decode"], None
    else:
        handler, endpoint_path, kind, runtime_config = engine.generate, args.endpoint, None, None
    # serve the handler, then publish the model card (not with --static: the frontend is told
    # the model); prints the READY line
    endpoint, server, card = await serve_model_from_args(
        runtime,
        args,
        handler,
        model_path,
        endpoint_path=endpoint_path,
        kind=kind,
        runtime_config=runtime_config,
    )
    logging.getLogger("hf_worker").info("%s serves %s with %s; card %s", server, endpoint, engine, card)

    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown()
    await runtime.wait_closed()
    await engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
