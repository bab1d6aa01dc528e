"""Programs written against Dynamo's ``dynamo.runtime`` API run on dynamo_nb with one import line
changed (tests/dynamo_shaped/: our own programs in the shape of Dynamo's hello_world and
cancellation examples), in one process and as processes over etcd + TCP, etcd + NATS and a folder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ROOT

from dynamo_nb import launch
from dynamo_nb.compat.runtime import Context, DistributedRuntime, dynamo_endpoint

pytestmark = pytest.mark.timeout(120)

SHAPED = ROOT / "tests" / "dynamo_shaped"


async def test_a_dynamo_worker_and_client_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYN_NB_DISCOVERY", "memory")

    @dynamo_endpoint(str, str)
    async def hello(request: str):
        for word in request.split(","):
            yield f"Hello {word}!"

    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    endpoint = runtime.namespace("hello_world").component("backend").endpoint("generate")
    await endpoint.component.create_service()
    serving = asyncio.get_running_loop().create_task(endpoint.serve_endpoint(hello))
    try:
        client = await runtime.endpoint("hello_world.backend.generate").client()
        await client.wait_for_instances()
        stream = await client.generate("world,sun")
        assert [response.data() async for response in stream] == ["Hello world!", "Hello sun!"]
        [instance] = client.instance_ids()
        direct = await client.direct("moon", instance)
        assert [response.data() async for response in direct] == ["Hello moon!"]
    finally:
        await runtime.shutdown_async()
        await asyncio.wait_for(serving, 10)


def test_a_dynamo_context_has_id_metadata_stop_and_kill() -> None:
    context = Context(metadata={"trace": "abc"})
    assert context.id() and context.metadata == {"trace": "abc"}
    assert not context.is_stopped() and not context.is_killed()
    context.stop_generating()
    assert context.is_stopped() and not context.is_killed()
    killed = Context()
    killed.kill()
    assert killed.is_stopped() and killed.is_killed()


def environments(services: Any, tmp_path: Path) -> dict[str, dict[str, str]]:
    etcd = {"ETCD_ENDPOINTS": "http://" + services.etcd_url.removeprefix("etcd://"), "DYN_NB_DISCOVERY": ""}
    return {
        "etcd-tcp": etcd,
        "etcd-nats": {**etcd, "DYN_REQUEST_PLANE": "nats", "NATS_SERVER": services.nats_url},
        "file-tcp": {"DYN_NB_DISCOVERY": f"file://{tmp_path / 'kv'}"},
    }


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
async def test_the_hello_world_worker_serves_a_dynamo_client(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    env = environments(services, tmp_path)[mode]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    worker = await launch(SHAPED / "hello_world.py", env=env, cwd=ROOT, log_dir=tmp_path, show_logs=False)
    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    try:
        client = await runtime.endpoint("hello_world.backend.generate").client()
        await client.wait_for_instances(timeout=30)
        stream = await client.generate("world,sun,moon,star")
        assert [r.data() async for r in stream] == [
            "Hello world!",
            "Hello sun!",
            "Hello moon!",
            "Hello star!",
        ]
    finally:
        await runtime.shutdown_async()
        await worker.stop(timeout=10)


def cancelled(lines: list[str]) -> bool:
    return any("Server: Cancelled at iteration" in line for line in lines)


@pytest.mark.parametrize("through", ["server", "middle"])
async def test_stopping_a_dynamo_request_reaches_the_server(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    env = environments(services, tmp_path)["etcd-tcp"]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    common = {"env": env, "cwd": ROOT, "log_dir": tmp_path, "show_logs": False}
    server = await launch(SHAPED / "cancellation_server.py", **common)
    middle = await launch(SHAPED / "cancellation_middle.py", **common) if through == "middle" else None
    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    try:
        client = await runtime.namespace("demo").component(through).endpoint("generate").client()
        await client.wait_for_instances(timeout=30)
        context = Context()
        received = []
        async for response in await client.generate("dummy_request", context=context):
            received.append(response.data())
            if len(received) == 3:
                context.stop_generating()
                break
        assert received == [0, 1, 2]
        for _ in range(100):  # the stop crossed the wire (twice, through the middle server)
            if cancelled(server.logs()):
                break
            await asyncio.sleep(0.05)
        assert cancelled(server.logs()), server.logs()
    finally:
        await runtime.shutdown_async()
        for process in (middle, server):
            if process is not None:
                await process.stop(timeout=10)


async def test_a_dynamo_llm_worker_registers_its_model_for_our_frontend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dynamo_nb.compat.llm import ModelInput, ModelType, register_llm
    from dynamo_nb.frontend import Frontend
    from dynamo_nb.models import tiny_model_path

    monkeypatch.setenv("DYN_NB_DISCOVERY", "memory")

    async def generate(request: dict[str, Any], context: Context):
        # a Dynamo token engine: token ids in, {"token_ids": [...]} items out (here: the prompt, reversed)
        tokens = request["token_ids"][::-1][: request["stop_conditions"]["max_tokens"]]
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            yield {"token_ids": [token], **({"finish_reason": "length"} if last else {})}

    runtime = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    endpoint = runtime.namespace("dynamo").component("backend").endpoint("generate")
    card = await register_llm(
        ModelInput.Tokens, ModelType.Chat | ModelType.Completions, endpoint, tiny_model_path(), "tiny-dynamo"
    )
    assert card.name == "tiny-dynamo" and set(card.kinds) == {"chat", "completions"}
    serving = asyncio.get_running_loop().create_task(endpoint.serve_endpoint(generate))
    frontend = await Frontend.start(await runtime.inner(), port=0)
    try:
        await frontend.wait_for_model("tiny-dynamo", timeout=10)  # the card went out when it served

        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            body = {"model": "tiny-dynamo", "prompt": [5, 6, 7, 8], "max_tokens": 3}
            reply = (await http.post("/v1/completions", json=body)).json()
        assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
        assert reply["choices"][0]["finish_reason"] == "length"
    finally:
        await frontend.stop()
        await runtime.shutdown_async()
        await asyncio.wait_for(serving, 10)


async def test_register_llm_refuses_text_input_with_what_to_use() -> None:
    from dynamo_nb.compat.llm import ModelInput, ModelType, register_llm
    from dynamo_nb.errors import ConfigError
    from dynamo_nb.models import tiny_model_path

    runtime = DistributedRuntime(None, "mem", None)
    endpoint = runtime.endpoint("dynamo.backend.generate")
    try:
        with pytest.raises(ConfigError, match=r"use ModelInput\.Tokens"):
            await register_llm(ModelInput.Text, ModelType.Chat, endpoint, tiny_model_path())
    finally:
        await runtime.shutdown_async()
