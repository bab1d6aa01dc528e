"""A middle server written against Dynamo's API (in the shape of Dynamo's cancellation example; our own code):
it forwards each request to demo.server with the caller's context, so a stop reaches the backend."""

import asyncio

from dynamo_nb.compat.runtime import DistributedRuntime


class MiddleServer:
    def __init__(self, runtime):
        self.runtime = runtime
        self.backend_client = None

    async def initialize(self):
        endpoint = self.runtime.namespace("demo").component("server").endpoint("generate")
        self.backend_client = await endpoint.client()
        await self.backend_client.wait_for_instances()

    async def generate(self, request, context):
        stream = await self.backend_client.generate(request, context=context)
        async for response in stream:
            yield response.data()


async def main():
    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    handler = MiddleServer(runtime)
    await handler.initialize()
    component = runtime.namespace("demo").component("middle")
    await component.create_service()
    await component.endpoint("generate").serve_endpoint(handler.generate)
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
