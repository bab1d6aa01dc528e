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
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.hf import HFEngine
from dynamo_nb.flags import hf_worker_parser
from dynamo_nb.llm import model_from_args
from dynamo_nb.runtime import configure_logging, run_program, runtime_from_args, shutdown_on_signals

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {
    "name": "hf-worker",
    "namespace": "dynamo",
    "resources": {"cpu": 1, "memory": "2Gi"},
    "needs": ["torch", "transformers"],
}


def build_parser():
    """The flags of this component (importable, e.g. by a graph launcher)."""
    return hf_worker_parser(prog="hf_worker", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    model_path, model_name = model_from_args(args)  # the built-in tiny model unless --model-path

    runtime: DistributedRuntime = await runtime_from_args(args)
    # the engine (with its prefix cache, whose KV events go out so a KV router follows it) served
    # in its --mode role; the model card is published (not with --static: the frontend is told)
    worker = await serve_engine(
        runtime,
        WorkerRole.from_args(args),
        model_path,
        model_name,
        lambda kv_events: HFEngine.from_args(args, model_path, kv_events=kv_events),
    )
    logging.getLogger("hf_worker").info("%s serves %s with %s", worker.server, worker.endpoint, worker.engine)
    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), set before READY says so
    worker.announce()  # READY <endpoint> instance=<id> address=<address> model=<name>
    await runtime.wait_closed()
    await worker.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
