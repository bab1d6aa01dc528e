"""A client written against Dynamo's API, in the shape of Dynamo's cancellation example (our own
code): reads three numbers from demo.server (or demo.middle with ``--middle``), then lets the
request go in one of the ways a caller does (``--how``):

- ``stop``: ``context.stop_generating()`` and break, as Dynamo's example does;
- ``break``: break out of the loop and drop the stream, then go on running for a while;
- ``exit``: break and end the program at once (the runtime is never shut down);
- ``die``: the process is killed (SIGKILL) right after the third number;
- ``pre-stopped``: the context is stopped before the request is sent (nothing comes back).
"""

import argparse
import asyncio
import faulthandler
import os
import signal

from dynamo_nb.compat.runtime import Context, DistributedRuntime


async def main(target: str, how: str):
    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    client = await runtime.namespace("demo").component(target).endpoint("generate").client()
    await client.wait_for_instances()
    context = Context()
    if how == "pre-stopped":
        context.stop_generating()
    stream = await client.generate("dummy_request", context=context)
    iteration = 0
    async for response in stream:
        print(f"Client: Received {response.data()}", flush=True)
        iteration += 1
        if iteration >= 3:
            if how == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "stop":
                print("Client: Cancelling after 3 responses...", flush=True)
                context.stop_generating()
            break
    print("Client: Done", flush=True)
    if how == "exit":
        return
    if how == "break":
        del stream
        await asyncio.sleep(3)  # a caller that goes on: the server must not wait for it to exit
    runtime.shutdown()


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a slow exit hangs
    parser = argparse.ArgumentParser()
    parser.add_argument("--middle", action="store_true")
    parser.add_argument("--how", choices=["stop", "break", "exit", "die", "pre-stopped"], default="stop")
    args = parser.parse_args()
    asyncio.run(main("middle" if args.middle else "server", args.how))
