"""OpenAI-compatible frontend: HTTP in, routed to the workers that registered a model.

A plain program: the runtime and the frontend are the objects you see in ``main``. With
discovery (``--discovery etcd://HOST:PORT``) it serves every model whose card a worker
publishes; in static mode it is told the one model and the worker endpoint instead.

    python components/frontend.py --help
    python components/frontend.py --discovery etcd://127.0.0.1:2379 --http-port 8000
    python components/frontend.py --static-endpoint dynamo.backend.generate --model-name tiny-llama \\
        --model-path DIR --nats-url nats://127.0.0.1:4222

It prints ``READY frontend url=http://HOST:PORT`` once it listens. ``--http-workers N`` runs N
frontend processes on the one port (``SO_REUSEPORT``), each with its own routers, so the frontend
uses N cores.
"""

from __future__ import annotations

import sys

from dynamo_nb import DistributedRuntime
from dynamo_nb.flags import frontend_parser
from dynamo_nb.frontend import Frontend, check_frontend_args
from dynamo_nb.frontend.replicas import start_frontend_replicas, stop_http_replicas
from dynamo_nb.notebook.component_program import load_router_policy
from dynamo_nb.runtime import (
    announce_ready,
    configure_logging,
    kit_runtime_from_args,
    run_program,
    shutdown_on_signals,
)

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {"name": "frontend", "namespace": "dynamo", "resources": {"cpu": 1, "memory": "1Gi"}}


def build_parser():
    """The flags of this component (importable, e.g. by a graph launcher)."""
    return frontend_parser(prog="frontend", description=__doc__)


async def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    config = check_frontend_args(args)  # each flag checked, bad combinations refused, naming the flag
    # --router-policy FILE[:NAME]: your policy, loaded (and checked) before anything starts
    policy = load_router_policy(config.router_policy) if config.router_policy else None

    # static discovery with --static-endpoint: the one model the flags name, no etcd
    runtime: DistributedRuntime = await kit_runtime_from_args(args, static=args.static_endpoint is not None)
    # HTTP, router mode, KV router settings; with --static-endpoint the model is given here
    frontend = await Frontend.start(runtime, config, router_policy=policy)
    shutdown_on_signals(runtime)
    # --http-workers N: N - 1 more processes like this one listen on the same port
    # (with the admin API they join this process's policy group: a change reaching one reaches all)
    replicas = await start_frontend_replicas(frontend, __file__, argv)
    announce_ready("frontend", url=frontend.url)

    await runtime.wait_closed()
    await stop_http_replicas(replicas)
    await frontend.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
