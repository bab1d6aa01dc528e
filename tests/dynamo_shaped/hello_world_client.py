"""A client written against Dynamo's ``dynamo.runtime`` API, in the shape of Dynamo's hello_world
client (our own code): prints each item of one request, then ends (Dynamo's loops forever)."""

import asyncio
import os

import uvloop

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    namespace = os.environ.get("DYN_TEST_HELLO_WORLD_NAMESPACE", "hello_world")
    client = await runtime.endpoint(f"{namespace}.backend.generate").client()
    await client.wait_for_instances()
    stream = await client.generate("world,sun,moon,star")
    async for response in stream:
        print(response.data(), flush=True)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
