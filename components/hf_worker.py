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

Prefix caching is on (``--prefix-cache-blocks``, ``--no-enable-prefix-caching``): the KV of
full prompt blocks is kept for later prompts, its KV events go out on the event plane (with
``--nats-url``) so ``--router-mode kv`` follows it, and ``{ns}.{comp}.stats`` reports the hits.

It prints ``READY <endpoint> instance=<id> address=<address> model=<name>`` once it serves.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.cli import (
    hf_engine_from_args,
    hf_worker_parser,
    model_path_from_args,
    role_from_args,
    runtime_from_args,
    serve_model_from_args,
)
from dynamo_nb.engines import stats_handler
from dynamo_nb.kv import KvEventPublisher
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
    engine = await hf_engine_from_args(args, model_path)  # with its prefix cache
    # the handler, endpoint and card of this worker's --mode
    role = await role_from_args(runtime, args, engine)
    # the prefix cache's KV events, so a KV router follows this worker's cache
    publisher = await KvEventPublisher.for_worker(
        runtime, runtime.endpoint(role.endpoint_path).component(), engine.kv_snapshot
    )
    engine.publish = publisher.publish if publisher is not None else None
    # serve the handler, then publish the model card (not with --static: the frontend is told
    # the model); prints the READY line
    endpoint, server, card = await serve_model_from_args(
        runtime,
        args,
        role.handler,
        model_path,
        endpoint_path=role.endpoint_path,
        kind=role.kind,
        runtime_config=role.runtime_config,
    )
    await endpoint.component().endpoint("stats").serve(stats_handler(engine.stats))  # prefix hits
    logging.getLogger("hf_worker").info("%s serves %s with %s; card %s", server, endpoint, engine, card)

    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown()
    await runtime.wait_closed()
    await engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
