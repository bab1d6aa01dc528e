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

It prints ``READY <endpoint> instances=<id>,<id>… model=<name>`` once every engine serves.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from dynamo_nb import ConfigError, DistributedRuntime
from dynamo_nb.cli import (
    mocker_worker_parser,
    model_name_from_args,
    model_path_from_args,
    role_from_args,
    runtime_from_args,
)
from dynamo_nb.engines import MockerEngine, stats_handler
from dynamo_nb.kv import KvEventPublisher
from dynamo_nb.llm import serve_llm
from dynamo_nb.worker import run_program, shutdown_on_signals


def build_parser():
    return mocker_worker_parser(prog="mocker_worker", description=__doc__)


async def start_engine(args, model_path) -> tuple[DistributedRuntime, MockerEngine]:
    """One engine: its runtime, its --mode role, KV event publisher, endpoint and model card."""
    runtime = await runtime_from_args(args)
    engine = MockerEngine(
        block_size=args.kv_cache_block_size,
        num_blocks=args.num_gpu_blocks,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speedup_ratio=args.speedup_ratio,
    )
    role = await role_from_args(runtime, args, engine)
    endpoint = runtime.endpoint(role.endpoint_path)
    publisher = await KvEventPublisher.for_worker(runtime, endpoint.component(), engine.kv_snapshot)
    engine.publish = publisher.publish if publisher is not None else None
    await serve_llm(
        endpoint,
        role.handler,
        model_path,
        model_name=model_name_from_args(args, model_path),
        kind=role.kind,
        kv_cache_block_size=args.kv_cache_block_size,
        context_length=args.context_length,
        runtime_config=role.runtime_config,
    )
    await endpoint.component().endpoint("stats").serve(stats_handler(engine.stats))  # prefix hits
    return runtime, engine


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.num_workers < 1:
        raise ConfigError(f"--num-workers must be at least 1, got {args.num_workers}")
    model_path = model_path_from_args(args)
    started = [await start_engine(args, model_path) for _ in range(args.num_workers)]
    ids = ",".join(f"{runtime.connection_id:x}" for runtime, _ in started)
    served = args.prefill_endpoint if args.mode == "prefill" else args.endpoint
    print(f"READY {served} instances={ids} model={model_name_from_args(args, model_path)}", flush=True)

    shutdown_on_signals(*(runtime for runtime, _ in started))  # SIGTERM / Ctrl-C → every engine's runtime
    await asyncio.gather(*(runtime.wait_closed() for runtime, _ in started))
    for _, engine in started:
        await engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
