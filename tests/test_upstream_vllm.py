"""Two real ``vllm serve`` processes (vLLM's CPU build, its own OpenAI server) behind the kit: an
upstream worker each (components/upstream_worker.py), the kit's frontend routing by vLLM's own
KV events (its ZMQ publisher, ``--kv-events-config``).

Checked: greedy text through the kit equals the server asked directly; a repeated long prompt goes
to the server that holds it (vLLM reports ``cached_tokens``); a client that disconnects frees
vLLM's slot (``vllm:num_requests_running`` falls); a server SIGKILLed mid-stream: the stream ends
on the other; vLLM's own 400 reaches an upstream engine's caller as that 400.

Skips (with the reason) when vLLM is not installed: ``python3 -m dynamo_nb install vllm``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, ROOT, free_port

from dynamo_nb import launch
from dynamo_nb.engines.upstream import UpstreamEngine
from dynamo_nb.errors import InvalidRequestError
from dynamo_nb.launch import ManagedProcess
from dynamo_nb.llm import PreprocessedRequest, StopConditions
from dynamo_nb.models import tiny_model_path

pytestmark = [pytest.mark.vllm, pytest.mark.processes, pytest.mark.timeout(600)]

MODEL = "tiny-llama"
BLOCK = 32
CONTEXT = 1024
ONE_THREAD = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


class Server:
    """One ``vllm serve``: its URL and its KV events' ZMQ endpoint."""

    def __init__(self, process: ManagedProcess, port: int, events: int) -> None:
        self.process, self.url, self.events = process, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{events}"


async def start_vllm(name: str, logs: Any) -> Server:
    port, events = free_port(bound_later=True), free_port(bound_later=True)  # vLLM binds them ~30 s on
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events}",
        "topic": "",
    }
    process = await launch(
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_path()),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK),
        "--max-model-len", str(CONTEXT), "--kv-cache-memory-bytes", str(256 << 20), "--enforce-eager",
        "--enable-prompt-tokens-details", "--kv-events-config", json.dumps(kv_events),
        name=name, env=ONE_THREAD, ready="Application startup complete", cwd=ROOT, log_dir=logs,
        show_logs=False, timeout=400,
    )  # fmt: skip
    return Server(process, port, events)


@pytest.fixture(scope="module")
async def fleet(services: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """Two vLLM servers, an upstream worker each and a KV-routing frontend, over etcd + NATS."""
    logs = tmp_path_factory.mktemp("upstream-vllm")
    servers = [await start_vllm(f"vllm{i}", logs) for i in range(2)]
    common = ["--discovery", services.etcd_url, "--nats-url", services.nats_url]
    workers = [
        await launch(
            ROOT / "components" / "upstream_worker.py",
            *common,
            "--upstream",
            server.url,
            "--upstream-kv-events",
            server.events,
            "--kv-cache-block-size",
            BLOCK,
            cwd=ROOT,
            log_dir=logs,
            show_logs=False,
            timeout=120,
            name=f"upstream{i}",
        )
        for i, server in enumerate(servers)
    ]
    port = free_port()
    frontend = await launch(FRONTEND, *common, "--http-port", port, "--router-mode", "kv", cwd=ROOT,
                            log_dir=logs, show_logs=False, timeout=60)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    from dynamo_nb import bench

    await bench.wait_for_model(url, MODEL, instances=2, timeout=60)
    yield {"servers": servers, "workers": workers, "url": url}
    for process in [frontend, *workers, *(server.process for server in servers)]:
        await process.stop(timeout=30)


async def chat(url: str, content: str, max_tokens: int = 12) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    async with httpx.AsyncClient(timeout=120) as http:
        return await http.post(f"{url}/v1/chat/completions", json=body)


async def test_greedy_text_through_the_kit_is_vllms_own(fleet: dict[str, Any]) -> None:
    direct = await chat(fleet["servers"][0].url, "Tell me about the sea")
    through = await chat(fleet["url"], "Tell me about the sea")
    assert direct.status_code == through.status_code == 200, through.text
    assert (
        through.json()["choices"][0]["message"]["content"]
        == direct.json()["choices"][0]["message"]["content"]
    )


async def test_vllms_own_kv_events_send_a_repeat_to_its_holder(fleet: dict[str, Any]) -> None:
    prompt = " ".join(f"line {i}: the harbour keeps its ships in rows" for i in range(12))
    served = []
    for _ in range(4):
        answer = await chat(fleet["url"], prompt, max_tokens=2)
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        served.append(
            (
                answer.headers["x-dynamo-decode-worker"],
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            )
        )
        await asyncio.sleep(0.2)  # vLLM publishes a step's events after the step
    assert len({worker for worker, _ in served[1:]}) == 1 and served[1][0] == served[0][0], served
    assert all(cached > 0 for _, cached in served[1:]), served


async def router_blocks(http: httpx.AsyncClient, url: str, worker: int) -> float:
    """The blocks the frontend's KV router holds cached on ``worker`` (its /metrics)."""
    text = (await http.get(f"{url}/metrics")).text
    series = f'dynamo_frontend_kv_router_blocks{{model="{MODEL}",worker="{worker:x}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


async def test_a_prefix_vllm_cached_for_another_client_draws_the_kits_request(fleet: dict[str, Any]) -> None:
    """Each server is asked a long prompt of its own directly (another client of the server, not
    the kit): only vLLM's KV events can tell the router where it is cached. Once they reached the
    router, the kit's request with that prompt goes there and finds it cached."""
    from dynamo_nb.llm import ModelTokenizer

    tokenizer = ModelTokenizer.load(tiny_model_path())
    for index, (server, worker) in enumerate(zip(fleet["servers"], fleet["workers"], strict=True)):
        prompt = f"server {index}: " + " ".join(
            f"line {i}: the lighthouse keeps its boats in rows" for i in range(12)
        )
        ids = tokenizer.encode(prompt)  # as the kit's frontend encodes a completion's prompt
        async with httpx.AsyncClient(timeout=120) as http:
            before = await router_blocks(http, fleet["url"], worker.instance_id)
            direct = await http.post(
                f"{server.url}/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1}
            )
            assert direct.status_code == 200, direct.text
            for _ in range(600):  # vLLM → its upstream worker → NATS → the router
                if await router_blocks(http, fleet["url"], worker.instance_id) >= before + len(ids) // BLOCK:
                    break
                await asyncio.sleep(0.05)
            assert await router_blocks(http, fleet["url"], worker.instance_id) >= before + len(ids) // BLOCK
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "nvext": {"extra_fields": ["routing"]}}
            answer = await http.post(f"{fleet['url']}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-dynamo-decode-worker"] == f"{worker.instance_id:x}", (
            index,
            answer.json()["nvext"],
        )
        assert answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def running_at(url: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


async def test_a_client_that_disconnects_frees_vllms_slot(fleet: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 500, "ignore_eos": True, "stream": True}
    servers = fleet["servers"]
    async with httpx.AsyncClient(base_url=fleet["url"], timeout=120) as http:
        async with http.stream("POST", "/v1/completions", json=body) as answer:
            lines = answer.aiter_lines()
            for _ in range(3):
                await anext(lines)
            assert sum([await running_at(server.url) for server in servers]) == 1  # vLLM runs it
            loads = []
            for server in servers:  # what an upstream worker reads of vLLM's load (its stats)
                engine = await UpstreamEngine.connect(server.url, timeout=30)
                loads.append(await engine.read_load())
                await engine.close()
            assert all({"running", "waiting", "kv_usage"} <= set(load) for load in loads), loads
            assert sum(load["running"] for load in loads) == 1, loads
    left = time.monotonic()
    for _ in range(200):
        if sum([await running_at(server.url) for server in servers]) == 0:
            break
        await asyncio.sleep(0.05)
    print(f"vLLM's running count fell to 0 {time.monotonic() - left:.2f} s after the client left")
    assert sum([await running_at(server.url) for server in servers]) == 0


async def test_vllms_own_400_reaches_the_upstream_engines_caller(fleet: dict[str, Any]) -> None:
    server = fleet["servers"][0]
    engine = await UpstreamEngine.connect(server.url, timeout=60)
    try:
        assert engine.context_length == CONTEXT
        request = PreprocessedRequest(
            token_ids=[450] * (CONTEXT + 8), stop_conditions=StopConditions(max_tokens=4)
        )
        with pytest.raises(InvalidRequestError) as refused:
            async for _ in engine.generate(request):
                pass
        assert refused.value.http_status == 400 and str(CONTEXT) in str(refused.value), refused.value
    finally:
        await engine.close()
    through = await chat(
        fleet["url"], "word " * (CONTEXT + 8), max_tokens=4
    )  # the kit refuses it first, as a 400
    assert through.status_code == 400 and through.json()["error"]["type"] == "invalid_request_error"


async def test_a_server_killed_mid_stream_ends_the_stream_on_the_other(fleet: dict[str, Any]) -> None:
    """Last: it kills one server."""
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 300, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    servers: list[Server] = fleet["servers"]
    usage, chunks = None, 0
    async with httpx.AsyncClient(base_url=fleet["url"], timeout=120) as http:
        async with http.stream("POST", "/v1/completions", json=body) as answer:
            victim = None
            async for line in answer.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                chunks += bool(event["choices"])
                if chunks == 10 and victim is None:
                    running = [await running_at(server.url) for server in servers]
                    victim = servers[running.index(max(running))]
                    victim.process.send_signal(signal.SIGKILL)
    assert usage is not None and usage["completion_tokens"] == 300, usage
    async with httpx.AsyncClient(base_url=fleet["url"], timeout=10) as http:  # its worker leaves /health
        for _ in range(300):
            if len((await http.get("/health")).json()["instances"]) == 1:
                break
            await asyncio.sleep(0.05)
        assert len((await http.get("/health")).json()["instances"]) == 1
