"""Echo worker: streams back the words of a request, one item per word.

A plain program (no decorator magic): the runtime, the endpoints and the servers are the
objects you see in ``main``. Beside ``--endpoint`` it serves ``<namespace>.<component>.stats``,
which reports how many requests it ran and how many were cancelled.

    python components/echo_worker.py --help
    python components/echo_worker.py --discovery etcd://127.0.0.1:2379 --request-plane tcp
    python components/echo_worker.py --static --nats-url nats://127.0.0.1:4222

Request: ``{"text": "a b c", "delay_ms": 0, "repeat": 1, "fail_at": null}``
Items:   ``{"word": "a", "index": 0}`` ...; a stopped request ends with ``{"stopped": true}``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from dynamo_nb import Context, DistributedRuntime, EndpointPath
from dynamo_nb.flags import echo_worker_parser
from dynamo_nb.runtime import (
    announce_ready,
    configure_logging,
    run_program,
    runtime_from_args,
    shutdown_on_signals,
)

# This component's deployment defaults, read by the graph launcher without running this file:
# a graph service that names no resources gets these.
DEPLOYMENT = {"name": "echo-worker", "namespace": "dynamo", "resources": {"cpu": 0.5, "memory": "512Mi"}}


def build_parser():
    """The flags of this component (importable, e.g. by a graph launcher)."""
    return echo_worker_parser(prog="echo_worker", description=__doc__)


async def echo(request: dict[str, Any], context: Context) -> Any:
    """Yield each word of ``request["text"]``; honour ``delay_ms``, ``repeat`` and ``fail_at``."""
    words = str(request.get("text", "")).split()
    delay = float(request.get("delay_ms", 0)) / 1000
    fail_at = request.get("fail_at")
    index = 0
    for _ in range(int(request.get("repeat", 1))):
        for word in words:
            if context.is_stopped():
                yield {"stopped": True}
                return
            if fail_at is not None and index == int(fail_at):
                raise ValueError(f"asked to fail at item {index}")
            if delay:
                await asyncio.sleep(delay)
            yield {"word": word, "index": index}
            index += 1


async def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    path = EndpointPath.parse(args.endpoint)

    runtime: DistributedRuntime = await runtime_from_args(args)
    generate = runtime.endpoint(str(path))  # as Dynamo 1.6 names one: runtime.endpoint("ns.comp.ep")
    stats = runtime.endpoint(f"{path.namespace}.{path.component}.stats")

    server = await generate.serve(echo)

    async def report(request: Any) -> Any:
        yield {
            "pid": os.getpid(),
            "instance_id": server.instance_id,
            "requests": server.requests_total,
            "cancelled": server.cancelled_total,
            "inflight": server.inflight,
        }

    await stats.serve(report)
    shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), set before READY says so
    announce_ready(str(generate.path), instance=f"{server.instance_id:x}", address=server.address)
    await runtime.wait_closed()
    return 0


if __name__ == "__main__":
    sys.exit(run_program(main))
