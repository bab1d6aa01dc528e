"""upstream worker: a running OpenAI-compatible server (``vllm serve``, SGLang's server, another
kit frontend) served as an engine, so the kit's frontend routes to it, records its decisions and
measures it, the server left as it is.

    vllm serve MODEL --port 8001 &                # or: python -m vllm.entrypoints.openai.api_server …
    python components/upstream_worker.py --upstream http://127.0.0.1:8001 --model-path MODEL_DIR \\
        --discovery file:///tmp/kv
    python components/frontend.py --discovery file:///tmp/kv

It waits until the server lists its models, serves ``--endpoint`` with the `UpstreamEngine` (the
prompt goes to the server as token ids, the generated ids come back with vLLM's
``return_token_ids``), registers the model card (the tokenizer and template from
``--model-path``, the built-in tiny model by default; the served name is ``--model-name``, else
the server's own) and prints ``READY <endpoint> instance=<id> address=<address> model=<name>``.
A client that leaves closes the server's request; the server's 4xx reaches the client as it was;
while the server does not answer the worker leaves discovery (``--upstream-health-interval``).
With ``--mode prefill`` / ``--mode decode`` it serves one half of a disaggregated pair of vLLM
servers started with a KV connector (``--kv-transfer-config``), the frontend passing vLLM's
``kv_transfer_params`` from the one to the other.
"""

from __future__ import annotations

import logging
import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.upstream import UpstreamEngine, UpstreamSettings
from dynamo_nb.flags import upstream_worker_parser
from dynamo_nb.llm import model_from_args
from dynamo_nb.runtime import configure_logging, run_program, runtime_from_args, shutdown_on_signals

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {"name": "upstream-worker", "namespace": "dynamo", "resources": {"cpu": 1, "memory": "512Mi"}}


def build_parser():
    """The flags of this component (importable, e.g. by a graph launcher)."""
    return upstream_worker_parser(prog="upstream_worker", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    role = WorkerRole.from_args(args)  # --mode prefill / decode: vLLM servers with a KV connector
    model_path, model_name = model_from_args(
        args
    )  # the tokenizer: the built-in tiny model unless --model-path
    engine = await UpstreamEngine.from_args(args, model_path)  # once the server lists its models
    if args.model_name is None:
        model_name = engine.model  # served under the server's own name
    runtime: DistributedRuntime = await runtime_from_args(args)
    # the server's KV events (--upstream-kv-events) go to the sink the worker's runtime gives
    worker = await serve_engine(runtime, role, model_path, model_name, engine.relay_events_to)
    logging.getLogger("upstream_worker").info("%s serves %s with %s", worker.server, worker.endpoint, engine)
    interval = UpstreamSettings.from_args(args).health_interval
    # in discovery only while the server answers (on the kit's runtime: Dynamo's has no withdrawal)
    watching = (
        engine.watch(worker.server, interval) if interval and hasattr(worker.server, "withdraw") else None
    )
    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), set before READY says so
    worker.announce()
    await runtime.wait_closed()
    if watching is not None:
        watching.cancel()
    await engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
