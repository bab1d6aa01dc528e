"""The runtime demo (``python -m dynamo_nb demo``): one process, then several.

Part 1 serves a streaming handler in this process and calls it with each client mode,
stops a request half way, and shows a handler error arriving at the caller. Part 2 starts
etcd and nats-server, runs a worker as a separate process (``python -m dynamo_nb demo-worker``)
and does the same over NATS. Every step checks its result; the exit status says whether
all of them held.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any

from .errors import RemoteHandlerError
from .flags import add_endpoint_arg, component_parser
from .launch.services import LocalServices
from .runtime.context import Context
from .runtime.distributed import DistributedRuntime
from .runtime.program import configure_logging, kit_runtime_from_args, shutdown_on_signals

__all__ = ["generate", "run_demo", "serve_worker"]

ENDPOINT = "demo.words.generate"


def _quiet_expected_errors() -> None:
    # The demo provokes a handler error on purpose; a real worker logs its traceback.
    logging.getLogger("dynamo_nb.server").setLevel(logging.ERROR)


async def generate(request: dict[str, Any], context: Context) -> Any:
    """Stream the words of ``request["text"]``; stop early when asked; fail on ``"boom"``."""
    for index, word in enumerate(str(request.get("text", "")).split()):
        if context.is_stopped():
            return
        if word == "boom":
            raise ValueError("the word 'boom' is not allowed")
        await asyncio.sleep(float(request.get("delay", 0)))
        yield {"index": index, "word": word}


def _say(text: str) -> None:
    print(text, flush=True)


async def _exercise(runtime: DistributedRuntime, label: str) -> None:
    """Call ``ENDPOINT`` with every client mode, cancel one request, provoke one error."""
    client = await runtime.endpoint(ENDPOINT).client()
    ids = await client.wait_for_instances(timeout=30)
    _say(f"  instances of {ENDPOINT}: {[f'{i:x}' for i in ids]}")
    text = "serving llms from a notebook"
    expected = [{"index": i, "word": w} for i, w in enumerate(text.split())]
    for mode in ("round_robin", "random"):
        stream = await getattr(client, mode)({"text": text})
        items = [item async for item in stream]
        assert items == expected, items
        _say(f"  {mode:<11} → instance {stream.instance_id:x}: {' '.join(i['word'] for i in items)}")
    items = [item async for item in client.direct({"text": text}, ids[0])]
    assert items == expected
    _say(f"  {'direct':<11} → instance {ids[0]:x}: {len(items)} items")

    context = Context()
    got = []
    started = time.perf_counter()
    async for item in client.round_robin({"text": "a b c d e f g h i j", "delay": 0.05}, context=context):
        got.append(item["word"])
        if len(got) == 2:
            context.stop_generating()
    assert len(got) < 10, got
    _say(f"  cancelled after {got}: the stream ended in {1000 * (time.perf_counter() - started):.0f} ms")

    try:
        async for _ in client.round_robin({"text": "x boom"}):
            pass
        raise AssertionError("the handler error did not arrive")
    except RemoteHandlerError as exc:
        _say(f"  handler error reached the caller: {exc.error_type}: {exc.remote_message}")
    _say(f"  {label}: ok")


async def run_demo(in_process_only: bool = False) -> int:
    """Run the demo; 0 when every check held."""
    _quiet_expected_errors()
    _say("1) one process: memory discovery, inproc request plane")
    async with await DistributedRuntime.create() as runtime:
        endpoint = runtime.namespace("demo").component("words").endpoint("generate")
        server = await endpoint.serve(generate)
        _say(f"  {runtime}\n  {server}")
        await _exercise(runtime, "in-process")
    if in_process_only:
        return 0

    _say("\n2) several processes: local etcd + nats-server, a worker subprocess, NATS request plane")
    async with await LocalServices.start() as services:
        _say(f"  {services}")
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamo_nb", "demo-worker",
            "--discovery", str(services.etcd_url), "--request-plane", "nats", "--nats-url", str(services.nats_url),
        )  # fmt: skip
        try:
            async with await DistributedRuntime.create(
                str(services.etcd_url), "nats", services.nats_url
            ) as runtime:
                await _exercise(runtime, "across processes")
        finally:
            worker.terminate()
            code = await asyncio.wait_for(worker.wait(), 15)
            _say(f"  worker pid {worker.pid} stopped (exit {code})")
    _say("\ndemo ok")
    return 0


async def serve_worker(argv: list[str]) -> int:
    """``python -m dynamo_nb demo-worker <runtime flags>``: serve `generate` until SIGTERM."""
    parser = component_parser(
        "python -m dynamo_nb demo-worker", serve_worker.__doc__, lambda p: add_endpoint_arg(p, ENDPOINT)
    )
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    _quiet_expected_errors()
    runtime = await kit_runtime_from_args(args)
    shutdown_on_signals(runtime)
    await runtime.endpoint(args.endpoint).serve_endpoint(generate)
    return 0
