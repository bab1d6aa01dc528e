"""Admission control across real processes: a mocker worker with ``--max-num-seqs 1`` behind a
frontend with ``--max-queue 1``: one request runs, one waits, the next gets a 503 at once
with ``Retry-After`` and OpenAI's error body; the waiting one is served when the slot frees.
And the least-loaded router skips an instance at its limit."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, RuntimeFactory, free_port, metric_value

from dynamo_nb.engines import EchoEngine
from dynamo_nb.llm import PreprocessedRequest, engine_handler
from dynamo_nb.router import LeastLoadedRouter

pytestmark = pytest.mark.timeout(120)

HI = [{"role": "user", "content": "Tell me about lighthouses."}]


async def queued(http: httpx.AsyncClient) -> float | None:
    return metric_value(
        (await http.get("/metrics")).text, "dynamo_frontend_queued_requests", model="tiny-llama"
    )


async def test_a_full_worker_and_a_full_queue_give_503_with_retry_after(
    services: Any, start_worker: Any
) -> None:
    flags = ["--discovery", services.etcd_url]
    # the mocker at real speed (~6 ms a token): the first request holds the slot for seconds,
    # however fast this machine decodes (a real engine runs ahead of a client that stops reading)
    await start_worker(
        *flags, "--endpoint", "adm.backend.generate", "--max-num-seqs", "1", script=MOCKER_WORKER
    )
    port = free_port()
    await start_worker(*flags, "--http-port", str(port), "--max-queue", "1", script=FRONTEND)
    body = {"model": "tiny-llama", "messages": HI, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for _ in range(100):
            if (await http.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.1)
        async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as running:
            lines = running.aiter_lines()
            assert (await lines.__anext__()).startswith("data: ")  # the worker's one slot is taken
            waiting = asyncio.ensure_future(http.post("/v1/chat/completions", json={**body, "max_tokens": 4}))
            for _ in range(200):
                if await queued(http) == 1:
                    break
                await asyncio.sleep(0.02)
            assert await queued(http) == 1 and not waiting.done()

            refused = await http.post("/v1/chat/completions", json=body)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "overloaded" and error["type"] == "service_unavailable_error"
            assert "--max-queue" in error["message"]
        # the running stream is closed: its slot goes to the waiting request
        served = await asyncio.wait_for(waiting, 30)
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4
        assert await queued(http) == 0
        metrics = (await http.get("/metrics")).text
        errors = {"model": "tiny-llama", "request_type": "unary", "status": "error"}
        assert metric_value(metrics, "dynamo_frontend_requests_total", **errors) == 1  # the refused one


async def test_the_least_loaded_router_skips_an_instance_at_its_limit(make_runtime: RuntimeFactory) -> None:
    servers = [await make_runtime("file-tcp") for _ in range(2)]
    for runtime in servers:
        await runtime.endpoint("ll.backend.generate").serve(engine_handler(EchoEngine().generate))
    client_rt = await make_runtime("file-tcp")
    client = await client_rt.endpoint("ll.backend.generate").client()
    await client.wait_for_instances(timeout=10)
    for _ in range(200):  # bounded: both instances in view
        if len(client.instance_ids()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(client.instance_ids()) == 2
    router = LeastLoadedRouter(client, limit_of=lambda _instance: 1)
    request = PreprocessedRequest(token_ids=[5, 6])
    first = router.pick(request)
    second = router.pick(request)
    assert second.instance_id != first.instance_id  # the first is at its limit of 1
    third = router.pick(request)  # both full: still the least loaded (admission decides the rest)
    assert router.inflight[third.instance_id] == 2
    for route in (first, second, third):
        router.finished(route)
    assert dict(router.inflight) == {}
    # requests through it reach both instances and release their load when they end
    streams = [router.send(request) for _ in range(4)]
    assert sorted(router.inflight.values()) == [2, 2]
    for stream in streams:
        assert len([item async for item in stream]) == 16
    assert dict(router.inflight) == {}
