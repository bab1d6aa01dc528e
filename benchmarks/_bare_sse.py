"""Bare aiohttp streaming chat completions as our frontend does, with nothing behind it: the
floor of what a Python server's SSE costs on this machine, for `frontend_overhead.py` (part 4).

It answers ``POST /v1/chat/completions`` with ``max_tokens`` events in our frontend's template
(a role chunk, one content chunk per token, the finish chunk, ``[DONE]``), one write per event,
on uvloop when installed and with the collector tuned, as our components run.

    python benchmarks/_bare_sse.py PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web

from dynamo_nb.runtime.program import run_tuned

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
PIECES = [" robot", " in", " a", " quiet", " library", "."]


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    tokens = int(body.get("max_tokens", 16))
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    head = json.dumps(
        {
            "id": "chatcmpl-bare",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
        },
        separators=(",", ":"),
    )[:-1]
    prefix = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'
    suffix = '},"logprobs":null,"finish_reason":null}]}\n\n'
    await response.write(
        f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
        f'"logprobs":null,"finish_reason":null}}]}}\n\n'.encode()
    )
    for index in range(tokens):
        await response.write(f"{prefix}{json.dumps(PIECES[index % len(PIECES)])}{suffix}".encode())
    await response.write(
        f'data: {head},"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"length"}}]}}\n\n'.encode()
    )
    await response.write(b"data: [DONE]\n\n")
    return response


async def serve(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"READY bare url=http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    run_tuned(serve(int(sys.argv[1])))  # as our components run: uvloop, the tuned collector
