"""A worker that uses Dynamo's unary helpers (our own code): ``calc.math.add`` is a unary handler
served with ``serve_unary_endpoint``; ``calc.math.silent`` streams nothing; ``calc.math.boom`` raises after one item;
``calc.math.short`` stops its own request after one item; ``calc.math.giveup`` raises CancelledError; ``calc.tokens.generate``
is a token engine (the prompt's ids, reversed) for ``LLMUnaryClient``."""

import asyncio

from dynamo_nb.compat.runtime import DistributedRuntime, dynamo_worker, serve_unary_endpoint


async def metadata(request, *, context):
    return dict(context.metadata)


async def add(request, *, context):
    return {"sum": request["a"] + request["b"], "request_id": context.id()}


async def silent(request, context):
    return
    yield


async def boom(request, context):
    yield "first"
    raise RuntimeError("boom")


async def cuts_itself_short(request, context):
    yield "one"
    context.stop_generating()


async def gives_up(request, context):
    yield "one"
    raise asyncio.CancelledError()


async def reversed_tokens(request, context):
    tokens = request["token_ids"][::-1][: request["stop_conditions"]["max_tokens"]]
    for i, token in enumerate(tokens):
        yield {"token_ids": [token], **({"finish_reason": "length"} if i == len(tokens) - 1 else {})}


@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    await asyncio.gather(
        serve_unary_endpoint(runtime.endpoint("calc.math.add"), add),
        serve_unary_endpoint(runtime.endpoint("calc.math.metadata"), metadata),
        runtime.endpoint("calc.math.silent").serve_endpoint(silent),
        runtime.endpoint("calc.math.boom").serve_endpoint(boom),
        runtime.endpoint("calc.math.short").serve_endpoint(cuts_itself_short),
        runtime.endpoint("calc.math.giveup").serve_endpoint(gives_up),
        runtime.endpoint("calc.tokens.generate").serve_endpoint(reversed_tokens),
    )


if __name__ == "__main__":
    asyncio.run(worker())
