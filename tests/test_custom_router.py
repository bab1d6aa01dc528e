"""A routing policy written as a plain function and plugged into a running frontend
(`Frontend.set_router`): its decisions show in the responses' worker ids and in the load
generator's DataFrame; a function that fails gives that request a 500 naming it, and the
frontend keeps serving."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from dynamo_nb import DistributedRuntime, bench
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import serve_llm
from dynamo_nb.router import FunctionRouter, RoundRobinRouter

pytestmark = pytest.mark.timeout(60)

MODEL = "routed"


async def test_a_function_router_set_on_a_running_frontend(
    tiny_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = await DistributedRuntime.create()
    endpoint = runtime.endpoint("cr.backend.generate")
    servers = [
        (await serve_llm(endpoint, EchoEngine().generate, tiny_path, model_name=MODEL))[0] for _ in range(2)
    ]
    short_worker, long_worker = sorted(server.instance_id for server in servers)
    frontend = await Frontend.start(runtime, port=0)
    try:
        await frontend.wait_for_model(MODEL, timeout=10)
        client = frontend.models.get(MODEL).client
        for _ in range(100):
            if len(client.instance_ids()) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(client.instance_ids()) == 2

        def by_length(request: Any, instance_ids: list[int]) -> int:
            """Long prompts to one worker, short ones to the other."""
            return long_worker if len(request.token_ids) > 20 else short_worker

        previous = await frontend.set_router(MODEL, by_length)
        assert isinstance(previous, RoundRobinRouter)
        prompts = [
            bench.Prompt("short", ({"role": "user", "content": "hi"},)),
            bench.Prompt("long", ({"role": "user", "content": "tell me " * 30},)),
        ]
        df = await bench.run(frontend.url, MODEL, prompts=prompts, concurrency=2, requests=8, max_tokens=4,
                             endpoint="completions", progress=False)  # fmt: skip
        assert df["error"].isna().all()
        decisions = dict(zip(df["prompt"], df["worker"], strict=False))
        assert decisions == {"short": f"{short_worker:x}", "long": f"{long_worker:x}"}
        router = frontend.models.get(MODEL).router
        assert isinstance(router, FunctionRouter) and router.picks == {short_worker: 4, long_worker: 4}

        def broken(request: Any, instance_ids: list[int]) -> int:
            raise KeyError("no such rule")

        await frontend.set_router(MODEL, broken)
        async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            with caplog.at_level(logging.WARNING, logger="dynamo_nb.frontend"):
                failed = await http.post("/v1/completions", json=body)
            assert failed.status_code == 500 and "broken raised KeyError" in failed.json()["error"]["message"]
            logged = [r for r in caplog.records if "broken raised KeyError" in r.getMessage()]
            assert logged and logged[0].exc_info is not None  # the function's traceback, to find the line
            assert "raise KeyError" in caplog.text
            await frontend.set_router(MODEL, lambda request, ids: max(ids) + 1)
            wrong = await http.post("/v1/completions", json=body)
            assert wrong.status_code == 500 and "not one of the instances" in wrong.json()["error"]["message"]
            await frontend.set_router(MODEL, RoundRobinRouter(client))
            assert (await http.post("/v1/completions", json=body)).status_code == 200
    finally:
        await frontend.stop()
        await runtime.shutdown()
