"""mocker engine worker: simulated engines for KV-routing experiments, no GPU, no model weights.

Each of ``--num-workers`` engines gets its own runtime (its own instance), serves ``--endpoint``
with the `MockerEngine` (and its counters at ``{ns}.{comp}.stats``), registers the model card (the tokenizer comes from ``--model-path``,
the built-in tiny model by default) and publishes its KV events on the event plane, with a
``kv_sync`` snapshot for routers that lost some. KV events need NATS across processes
(``--nats-url``); without it the engines run and the router can use ``--no-kv-events``.

    python components/mocker_worker.py --discovery etcd://127.0.0.1:2379 --nats-url nats://127.0.0.1:4222 \\
        --num-workers 4 --speedup-ratio 10
    python components/frontend.py --discovery etcd://127.0.0.1:2379 --nats-url nats://127.0.0.1:4222 --router-mode kv

``--mode prefill`` / ``--mode decode`` make disaggregated prefill and decode engines (as the
hf worker's): a prefill engine serves ``--prefill-endpoint`` and parks a handoff in its own
bootstrap server; a decode engine fetches it and decodes.

    python components/mocker_worker.py --mode prefill --discovery etcd://… --nats-url nats://… --num-workers 2
    python components/mocker_worker.py --mode decode --discovery etcd://… --nats-url nats://… --num-workers 2

It prints ``READY <endpoint> instance=<id>,<id>… model=<name>`` once every engine serves.
"""

from __future__ import annotations

import asyncio
import sys

from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import EngineWorker, serve_engine
from dynamo_nb.engines.mocker import MockerEngine, MockerWorkerSettings
from dynamo_nb.flags import mocker_worker_parser
from dynamo_nb.llm import model_from_args
from dynamo_nb.runtime import (
    DistributedRuntime,
    announce_ready,
    configure_logging,
    run_program,
    runtime_from_args,
    shutdown_on_signals,
)

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {"name": "mocker-worker", "namespace": "dynamo", "resources": {"cpu": 1, "memory": "1Gi"}}


def build_parser():
    """The flags of this component (importable, e.g. by a graph launcher)."""
    return mocker_worker_parser(prog="mocker_worker", description=__doc__)


async def start_engine(args, model_path, model_name) -> tuple[DistributedRuntime, EngineWorker]:
    """One engine: its own runtime (its own instance), served in its --mode role with its KV events;
    it streams prompt ids but not the tokenizer's special ones (they decode to no text)."""
    runtime = await runtime_from_args(args)
    worker = await serve_engine(
        runtime,
        WorkerRole.from_args(args),
        model_path,
        model_name,
        lambda kv_events: MockerEngine.from_args(args, model_path, kv_events=kv_events),
    )
    return runtime, worker


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    workers = MockerWorkerSettings.from_args(args).num_workers  # checked: at least 1
    model_path, model_name = model_from_args(
        args
    )  # its tokenizer: the built-in tiny model unless --model-path
    started = [await start_engine(args, model_path, model_name) for _ in range(workers)]
    ids = ",".join(f"{worker.server.instance_id:x}" for _, worker in started)
    shutdown_on_signals(*(runtime for runtime, _ in started))  # SIGTERM / Ctrl-C → every engine's runtime
    announce_ready(str(started[0][1].endpoint.path), instance=ids, model=model_name)
    await asyncio.gather(*(runtime.wait_closed() for runtime, _ in started))
    for _, worker in started:
        await worker.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
