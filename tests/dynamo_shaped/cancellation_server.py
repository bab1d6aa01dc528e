"""A server written against Dynamo's API (in the shape of Dynamo's cancellation example; our own code): numbers
0-999, one every 0.1 s; it raises CancelledError once its caller stops, as Dynamo's does."""

import asyncio

from dynamo_nb.compat.runtime import DistributedRuntime


class DemoServer:
    async def generate(self, request, context):
        for i in range(1000):
            if context.is_stopped():
                print(f"Server: Cancelled at iteration {i}", flush=True)
                raise asyncio.CancelledError
            await asyncio.sleep(0.1)
            yield i


async def main():
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "etcd", False)
    component = runtime.namespace("demo").component("server")
    await component.create_service()
    endpoint = component.endpoint("generate")
    await endpoint.serve_endpoint(DemoServer().generate)
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
