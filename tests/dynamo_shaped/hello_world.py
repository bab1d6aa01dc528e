"""A worker written against Dynamo's ``dynamo.runtime`` API (the shape of Dynamo's hello_world
example); only the import line names dynamo_nb. Streams "Hello <word>!" for each comma-separated word."""

import asyncio
import os

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_endpoint, dynamo_worker


@dynamo_endpoint(str, str)
async def content_generator(request: str):
    for word in request.split(","):
        await asyncio.sleep(float(os.environ.get("WORD_DELAY", "0.01")))
        yield f"Hello {word}!"


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    endpoint = runtime.endpoint("hello_world.backend.generate")
    print("READY hello_world.backend.generate", flush=True)
    await endpoint.serve_endpoint(content_generator)


if __name__ == "__main__":
    asyncio.run(worker())
