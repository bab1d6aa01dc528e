"""A worker written against Dynamo's ``dynamo.runtime`` API, in the shape of Dynamo's hello_world
example (our own code); only the import lines name dynamo_nb. Streams "Hello <word>!" for each
comma-separated word, one every DYN_TEST_HELLO_WORLD_WORD_DELAY_SEC seconds (default 1)."""

import asyncio
import logging
import os

import uvloop

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_endpoint, dynamo_worker
from dynamo_nb.compat.runtime.logging import configure_dynamo_logging

logger = logging.getLogger(__name__)
configure_dynamo_logging(service_name="backend")


@dynamo_endpoint(str, str)
async def content_generator(request: str):
    logger.info(f"Received request: {request}")
    delay = float(os.environ.get("DYN_TEST_HELLO_WORLD_WORD_DELAY_SEC", "1.0"))
    for word in request.split(","):
        await asyncio.sleep(delay)
        yield f"Hello {word}!"


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    namespace = os.environ.get("DYN_TEST_HELLO_WORLD_NAMESPACE", "hello_world")
    logger.info(f"Serving endpoint {namespace}/backend/generate")
    await runtime.endpoint(f"{namespace}.backend.generate").serve_endpoint(content_generator)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())
