"""SGLang worker: ``sglang.Engine`` behind an endpoint, with SGLang's bootstrap disaggregation.

A plain program, like the other workers: the runtime, the engine, the endpoint, its server
and the model card are the objects you see in ``main``. Its flags are ours (runtime,
``--model-name``, ``--endpoint``, ``--prefill-endpoint``) plus **SGLang's own server
arguments** with SGLang's help (``--disaggregation-mode``, ``--disaggregation-bootstrap-port``,
``--disaggregation-transfer-backend``, ``--tp-size``, ``--page-size``, ``--kv-events-config``,
…); ``--help`` lists them all. Needs a CUDA GPU and ``pip install -e ".[sglang]"``.

    # on a GPU machine: a prefill and a decode worker (Dynamo's fast path), then the frontend
    python components/sglang_worker.py --discovery etcd://127.0.0.1:2379 --model-path /models/Qwen3-0.6B \\
        --disaggregation-mode prefill --disaggregation-bootstrap-port 12345 --disaggregation-transfer-backend nixl
    python components/sglang_worker.py --discovery etcd://127.0.0.1:2379 --model-path /models/Qwen3-0.6B \\
        --disaggregation-mode decode --disaggregation-transfer-backend nixl --base-gpu-id 1

Its role is SGLang's ``--disaggregation-mode``: ``null`` serves ``generate`` at ``--endpoint``;
``prefill`` serves at ``--prefill-endpoint`` and publishes SGLang's bootstrap server (host,
``--disaggregation-bootstrap-port``) as its card's ``disaggregated_endpoint``, so the frontend
draws the room and sends both legs at once; ``decode`` serves at ``--endpoint`` and asks a
prefill worker itself for a request that comes without bootstrap info.

Without a GPU, ``--fake-engine`` serves the same code against a stand-in with SGLang's method
signatures that records every call (``--fake-record calls.jsonl``): that is how the tests and
notebook 08 run here.

It prints ``READY <endpoint> instance=<id> address=<address> model=<name>`` once it serves.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.sglang import SglangEngine
from dynamo_nb.extras import require_extra
from dynamo_nb.flags import sglang_worker_parser
from dynamo_nb.llm import model_from_args
from dynamo_nb.runtime import configure_logging, run_program, runtime_from_args, shutdown_on_signals

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {
    "name": "sglang-worker",
    "namespace": "dynamo",
    "resources": {"gpu": 1},
    "needs": ["sglang"],
}


def build_parser():
    """The flags of this component, ours and SGLang's (importable, e.g. by a graph launcher)."""
    return sglang_worker_parser(prog="sglang_worker", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.fake_engine:  # one line and exit 2 where SGLang is missing
        require_extra("sglang", "the SGLang worker (without --fake-engine)")
    configure_logging(args.log_level)
    args.mode = {"null": "aggregated"}.get(args.disaggregation_mode, args.disaggregation_mode)
    args.model_name = args.model_name or args.served_model_name
    model_path, model_name = model_from_args(args)  # the built-in tiny model unless --model-path

    runtime: DistributedRuntime = await runtime_from_args(args)
    # SGLang (or its recording stand-in), its KV events relayed to the event plane, served in its
    # --disaggregation-mode role; the card carries SGLang's page size and context length
    worker = await serve_engine(
        runtime,
        WorkerRole.from_args(args),
        model_path,
        model_name,
        lambda kv_events: SglangEngine.from_args(args, model_path, kv_events=kv_events),
    )
    logging.getLogger("sglang_worker").info(
        "%s serves %s with %s", worker.server, worker.endpoint, worker.engine
    )
    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), set before READY says so
    worker.announce()  # READY <endpoint> instance=<id> address=<address> model=<name>
    await runtime.wait_closed()
    await worker.engine.close()
    return 0


if __name__ == "__main__":  # SGLang starts its scheduler processes with spawn: this guard is required
    sys.exit(run_program(main))
