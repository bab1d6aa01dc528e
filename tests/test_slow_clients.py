"""Slow and idle clients: a frontend closes connections whose headers trickle in (slowloris)
after its header timeout, closes keep-alive connections idle past its idle timeout, refuses
connections beyond its cap with a 503 in OpenAI's envelope — and serves normal requests all
the while."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dynamo_nb import DistributedRuntime
from dynamo_nb.engines import EchoEngine
from dynamo_nb.flags import frontend_parser
from dynamo_nb.frontend import Frontend, FrontendConfig
from dynamo_nb.llm import serve_llm

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def frontend(tiny_path: Path) -> AsyncIterator[Frontend]:
    runtime = await DistributedRuntime.create()
    await serve_llm(
        runtime.endpoint("slow.backend.generate"), EchoEngine().generate, tiny_path, model_name="tiny"
    )
    front = await Frontend.start(runtime, port=0, header_timeout=1.0, idle_timeout=2.0, max_connections=40)
    await front.wait_for_model("tiny")
    yield front
    await front.stop()
    await runtime.shutdown(grace=0)


async def closed_within(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float) -> bool:
    """Whether the server closes the connection within ``seconds``, while we keep sending a
    header byte every 0.1 s (a slowloris)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        try:
            writer.write(b"X")
            await writer.drain()
            data = await asyncio.wait_for(reader.read(1024), 0.1)
        except asyncio.TimeoutError:
            continue
        except ConnectionError:
            return True
        if not data:
            return True
    return False


async def test_slowloris_connections_are_closed_and_normal_requests_are_served(frontend: Frontend) -> None:
    port = frontend.port

    async def slowloris() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        try:
            return await closed_within(reader, writer, 8.0)
        finally:
            writer.close()

    probes = [asyncio.create_task(slowloris()) for _ in range(30)]
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
        for _ in range(5):  # served while the slow connections are open
            assert (await http.post("/v1/chat/completions", json=BODY)).status_code == 200
    assert all(await asyncio.gather(*probes)), "a slow connection was still open after the header timeout"
    assert frontend.connections.timed_out_total >= 30


async def test_connections_beyond_the_cap_get_a_503_and_idle_ones_are_closed(frontend: Frontend) -> None:
    port = frontend.port
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]  # the cap: nothing sent
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and json.loads(body)["error"]["code"] == 503
    assert frontend.connections.refused_total == 1
    for idle_reader, idle_writer in idle:  # closed by the header timeout: they sent nothing
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""
        idle_writer.close()
    # a keep-alive connection idle past the idle timeout is closed once its request is answered
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
    response = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert response.startswith(b"HTTP/1.1 200")
    rest: Any = await asyncio.wait_for(reader.read(), 6)  # the body, then the close after 2 s idle
    assert reader.at_eof() and rest is not None
    writer.close()
    async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
        assert (await http.post("/v1/chat/completions", json=BODY)).status_code == 200


def test_the_flags() -> None:
    args = frontend_parser().parse_args(
        ["--http-header-timeout", "5", "--http-idle-timeout", "30", "--http-max-connections", "100"]
    )
    config = FrontendConfig.from_args(args)
    assert (config.header_timeout, config.idle_timeout, config.max_connections) == (5.0, 30.0, 100)
