"""Admission control across real processes: a mocker worker with ``--max-num-seqs 1`` behind a
frontend with ``--max-queue 1 --queue-timeout 1.5``: one request runs, one waits; the next is
refused at once and the waiting one when its time is up, each with its reason, the measured
value and the threshold, ``Retry-After`` and OpenAI's error body; a request that waits while
the slot frees is served.
And the least-loaded router skips an instance at its limit."""

from __future__ import annotations

import asyncio
import re
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


@pytest.mark.parametrize("status", [503, 529])
async def test_each_limit_a_request_hits_is_named_answered_and_counted(
    services: Any, start_worker: Any, status: int
) -> None:
    """One request runs, one waits: the next finds the queue full and the waiting one runs out of
    time. Each refusal says which limit, the value measured and the threshold, is answered at once
    with 503 (or 529, ``--overload-status``) and ``Retry-After``, and is counted once by its
    reason; a request that waits while a slot frees is served."""
    flags = ["--discovery", services.etcd_url]
    # the mocker at real speed (~6 ms a token): the first request holds the slot for seconds,
    # however fast this machine decodes (a real engine runs ahead of a client that stops reading)
    await start_worker(
        *flags, "--endpoint", "adm.backend.generate", "--max-num-seqs", "1", script=MOCKER_WORKER
    )
    port = free_port()
    limits = ["--max-queue", "1", "--queue-timeout", "1.5"] + (
        ["--overload-status", "529"] if status == 529 else []
    )
    await start_worker(*flags, "--http-port", str(port), *limits, script=FRONTEND)
    body = {"model": "tiny-llama", "messages": HI, "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for _ in range(100):
            if (await http.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.1)

        async def wait_until_queued() -> None:
            for _ in range(200):
                if await queued(http) == 1:
                    break
                await asyncio.sleep(0.02)
            assert await queued(http) == 1

        async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as running:
            lines = running.aiter_lines()
            assert (await lines.__anext__()).startswith("data: ")  # the worker's one slot is taken
            times_out = asyncio.ensure_future(
                http.post("/v1/chat/completions", json={**body, "max_tokens": 4})
            )
            await wait_until_queued()

            full = await http.post("/v1/chat/completions", json=body)
            assert full.status_code == status and full.headers["Retry-After"] == "1"
            error = full.json()["error"]
            assert error["code"] == "overloaded" and error["type"] == "service_unavailable_error"
            assert "1 requests wait, the limit is 1 (the frontend's --max-queue)" in error["message"]
            assert "1 requests in flight, capacity 1" in error["message"]

            late = await asyncio.wait_for(times_out, 30)
            assert late.status_code == status
            message = late.json()["error"]["message"]
            waited = re.search(
                r"waited (\d+\.\d) s for a slot; the limit is 1\.5 s \(the frontend's --queue-timeout\)",
                message,
            )
            assert waited and float(waited[1]) >= 1.5, message

            served = asyncio.ensure_future(http.post("/v1/chat/completions", json={**body, "max_tokens": 4}))
            await wait_until_queued()
        # the running stream is closed: its slot goes to the waiting request
        answer = await asyncio.wait_for(served, 30)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        assert await queued(http) == 0
        metrics = (await http.get("/metrics")).text
        for reason in ("queue_full", "queue_timeout"):
            rejected = metric_value(
                metrics, "dynamo_frontend_model_rejection_total", model="tiny-llama", reason=reason
            )
            assert rejected == 1, reason
        errors = {"model": "tiny-llama", "request_type": "unary", "status": "error"}
        assert metric_value(metrics, "dynamo_frontend_requests_total", **errors) == 2  # the refused ones


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
