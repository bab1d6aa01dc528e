"""A client that closes its HTTP connection mid-stream stops generation on the workers of a
disaggregated request: the decode worker's running sequences drop to none long before the
request's token budget is spent (read from its ``stats`` endpoint, not by sleeping), and the
prefill worker holds no bootstrap room."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, HF_WORKER, RuntimeFactory, free_port

from dynamo_nb import bench

pytestmark = pytest.mark.timeout(120)

TOKENS = 900


async def stats(client: Any) -> dict[str, int]:
    return [item async for item in client.round_robin({})][-1]


async def test_a_client_leaving_mid_stream_stops_both_legs(
    services: Any, start_worker: Any, make_runtime: RuntimeFactory
) -> None:
    etcd = ["--discovery", services.etcd_url]
    endpoints = ["--endpoint", "dc.backend.generate", "--prefill-endpoint", "dc.prefill.generate"]
    await start_worker(*etcd, *endpoints, "--mode", "prefill", script=HF_WORKER)
    await start_worker(*etcd, *endpoints, "--mode", "decode", script=HF_WORKER)
    port = free_port()
    await start_worker(*etcd, "--http-port", str(port), script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    await bench.wait_for_model(url, "tiny-llama", timeout=30)
    rt = await make_runtime("etcd-tcp")
    decode_stats = await rt.endpoint("dc.backend.stats").client()
    prefill_stats = await rt.endpoint("dc.prefill.stats").client()
    await decode_stats.wait_for_instances(timeout=10)
    await prefill_stats.wait_for_instances(timeout=10)

    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["x-dynamo-path"] == "fast"
            # hold the line iterator: a dropped one is closed at once, which closes the stream
            lines = response.aiter_lines()
            events = 0
            while events < 5:
                events += (await anext(lines)).startswith("data: ")
            before = await stats(decode_stats)
            assert before["active"] == 1
        left = time.perf_counter()  # the client closed its connection
        for _ in range(200):
            after = await stats(decode_stats)
            if after["active"] == 0:
                break
            await asyncio.sleep(0.01)
        stopped_after_s = time.perf_counter() - left
        assert after["active"] == 0
        # far fewer steps than the tokens it had left: the decode stopped, it did not finish
        assert after["steps"] - before["steps"] < (TOKENS - 5) // 2, (before, after, stopped_after_s)
        assert (await stats(prefill_stats))["bootstrap_rooms"] == 0
