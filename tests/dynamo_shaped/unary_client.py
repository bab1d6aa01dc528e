"""A client of unary_worker.py through Dynamo's unary helpers (our own code): one answer per
call, and the errors Dynamo programs expect (a handler's exception as a ValueError)."""

import asyncio

from dynamo_nb.compat.llm import LLMUnaryClient
from dynamo_nb.compat.runtime import Context, DistributedRuntime, UnaryClient, dynamo_worker


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    adder = await runtime.endpoint("calc.math.add").client()
    await adder.wait_for_instances()
    answer = await UnaryClient(adder).complete({"a": 2, "b": 3}, context=Context("req-7"))
    print("sum", answer["sum"], answer["request_id"], flush=True)
    echo = await runtime.endpoint("calc.math.metadata").client()
    await echo.wait_for_instances()
    print(
        "metadata", await UnaryClient(echo).complete({}, context=Context(metadata={"user": "a"})), flush=True
    )
    silent = await runtime.endpoint("calc.math.silent").client()
    await silent.wait_for_instances()
    try:
        await UnaryClient(silent).complete({})
    except RuntimeError as error:
        print("silent:", error, flush=True)
    for name in ("boom", "short", "giveup"):
        client = await runtime.endpoint(f"calc.math.{name}").client()
        await client.wait_for_instances()
        received = []
        try:
            async for item in await client.generate("x"):
                received.append(item.data())
        except ValueError as error:  # what Dynamo programs catch around a stream
            print(f"{name}:", received, repr(str(error)), len(client.instance_ids()), flush=True)
    llm = await LLMUnaryClient.connect(runtime, "calc.tokens.generate")
    request = {"token_ids": [5, 6, 7, 8], "stop_conditions": {"max_tokens": 3}, "sampling_options": {}}
    done = await llm.complete(request)
    print("tokens", done["token_ids"], done["finish_reason"], flush=True)
    try:
        await llm.complete({**request, "sampling_options": {"n": 2}})
    except ValueError as error:
        print("n=2:", error, flush=True)


if __name__ == "__main__":
    asyncio.run(worker())
