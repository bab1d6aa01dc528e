"""A client in the shape of Dynamo's hello_world client (our own code): it asks the hello_world
worker again and again and never returns by itself, so only a signal ends it. On Dynamo 1.6.1
Ctrl-C raises KeyboardInterrupt and SIGTERM ends the process: the runtime installs no handler."""

import asyncio
import os

import uvloop

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    namespace = os.environ.get("DYN_TEST_HELLO_WORLD_NAMESPACE", "hello_world")
    client = await runtime.endpoint(f"{namespace}.backend.generate").client()
    await client.wait_for_instances()
    while True:
        stream = await client.generate("world,sun")
        async for response in stream:
            print(response.data(), flush=True)
        await asyncio.sleep(0.05)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
