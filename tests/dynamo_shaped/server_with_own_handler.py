"""A worker that installs its own SIGTERM handler right after creating the runtime, as Dynamo's
own frontend does (our own code): on SIGTERM it prints "drained", shuts the runtime down and
returns 0. The runtime must leave that handler in place."""

import asyncio
import os
import signal

import uvloop

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_endpoint


@dynamo_endpoint(str, str)
async def content_generator(request: str):
    for word in request.split(","):
        yield f"Hello {word}!"


async def main():
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "etcd", False)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    namespace = os.environ.get("DYN_TEST_HELLO_WORLD_NAMESPACE", "hello_world")
    serving = loop.create_task(
        runtime.endpoint(f"{namespace}.backend.generate").serve_endpoint(content_generator)
    )
    await stop.wait()
    print("drained", flush=True)
    runtime.shutdown()
    await asyncio.gather(serving, return_exceptions=True)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(main())
