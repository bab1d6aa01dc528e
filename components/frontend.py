"""OpenAI-compatible frontend: HTTP in, routed to the workers that registered a model.

A plain program: the runtime and the frontend are the objects you see in ``main``. With
discovery (``--discovery etcd://HOST:PORT``) it serves every model whose card a worker
publishes; in static mode it is told the one model and the worker endpoint instead.

    python components/frontend.py --help
    python components/frontend.py --discovery etcd://127.0.0.1:2379 --http-port 8000
    python components/frontend.py --static-endpoint dynamo.backend.generate --model-name tiny-llama \\
        --model-path DIR --nats-url nats://127.0.0.1:4222

It prints ``READY http://HOST:PORT`` once it listens.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.cli import frontend_parser, kv_config_from_args, runtime_from_args, validate_frontend_args
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import card_from_folder
from dynamo_nb.worker import run_program, shutdown_on_signals


def build_parser():
    return frontend_parser(prog="frontend", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    validate_frontend_args(args)  # bad flag combinations fail here, naming the flag to change

    runtime: DistributedRuntime = await runtime_from_args(args)  # static discovery with --static-endpoint
    frontend = await Frontend.start(
        runtime,
        host=args.http_host,
        port=args.http_port,
        router_mode=args.router_mode,
        enforce_disagg=args.enforce_disagg,
        kv_config=kv_config_from_args(args),
    )
    if args.static_endpoint:  # static mode: build the model card here; no etcd, no registration
        card = card_from_folder(args.model_path, name=args.model_name, endpoint=args.static_endpoint)
        await frontend.add_model(card, address=args.static_address)
    print(f"READY {frontend.url}", flush=True)

    shutdown_on_signals(runtime)
    await runtime.wait_closed()
    await frontend.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
