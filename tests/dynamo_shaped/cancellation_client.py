"""A client written against Dynamo's API, in the shape of Dynamo's cancellation example (our own
code): reads three numbers from demo.server (or demo.middle with ``--middle``), then stops the
request through its context."""

import asyncio
import sys

from dynamo_nb.compat.runtime import Context, DistributedRuntime


async def main(use_middle: bool):
    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    target = "middle" if use_middle else "server"
    client = await runtime.namespace("demo").component(target).endpoint("generate").client()
    await client.wait_for_instances()
    context = Context()
    stream = await client.generate("dummy_request", context=context)
    iteration = 0
    async for response in stream:
        print(f"Client: Received {response.data()}", flush=True)
        iteration += 1
        if iteration >= 3:
            print("Client: Cancelling after 3 responses...", flush=True)
            context.stop_generating()
            break
    print("Client: Done", flush=True)
    runtime.shutdown()


if __name__ == "__main__":
    asyncio.run(main("--middle" in sys.argv[1:]))
