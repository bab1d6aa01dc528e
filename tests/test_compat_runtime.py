"""Programs written against Dynamo's ``dynamo.runtime`` API run on dynamo_nb with one import line
changed (tests/dynamo_shaped/: our own programs in the shape of Dynamo's hello_world and
cancellation examples), in one process and as processes over etcd + TCP, etcd + NATS and a folder."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
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


def use_environment(
    monkeypatch: pytest.MonkeyPatch, services: Any, tmp_path: Path, mode: str, **extra: str
) -> dict[str, str]:
    """The environment of ``mode`` (plus ``extra``), set in this process too (the watcher's runtime reads it)."""
    env = {**environments(services, tmp_path)[mode], **extra}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


async def run_program(program: Path, *args: str, env: dict[str, str], timeout: float = 60) -> list[str]:
    """Run a client program to its end; its stdout lines (its exit status must be 0)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(program),
        *args,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    lines = output.decode().splitlines()
    assert process.returncode == 0, lines
    return lines


async def serve_program(program: Path, instance: str, env: dict[str, str], log_dir: Path) -> Any:
    """Launch a Dynamo-shaped server; ready once ``instance`` is in discovery (it prints no READY line)."""
    watcher = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    try:
        return await launch(
            program,
            env=env,
            cwd=ROOT,
            log_dir=log_dir,
            show_logs=False,
            ready=None,
            instance=instance,
            runtime=await watcher.inner(),
            timeout=60,
        )
    finally:
        await watcher.shutdown_async()


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
async def test_the_hello_world_worker_serves_the_hello_world_client(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    env = use_environment(monkeypatch, services, tmp_path, mode, DYN_TEST_HELLO_WORLD_WORD_DELAY_SEC="0.01")
    worker = await serve_program(SHAPED / "hello_world.py", "hello_world.backend.generate", env, tmp_path)
    try:
        printed = await run_program(SHAPED / "hello_world_client.py", env=env)
        assert printed[-4:] == ["Hello world!", "Hello sun!", "Hello moon!", "Hello star!"]
        assert any(
            "[backend] __main__: Received request: world,sun,moon,star" in line for line in worker.logs()
        )
    finally:
        await worker.stop(timeout=10)


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_signal_ends_a_looping_dynamo_client(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, signum: int
) -> None:
    """As on Dynamo 1.6.1, whose runtime installs no signal handler: Ctrl-C (KeyboardInterrupt)
    and SIGTERM end a client whose loop never returns by itself, within seconds."""
    env = use_environment(monkeypatch, services, tmp_path, mode, DYN_TEST_HELLO_WORLD_WORD_DELAY_SEC="0.01")
    worker = await serve_program(SHAPED / "hello_world.py", "hello_world.backend.generate", env, tmp_path)
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(SHAPED / "looping_client.py"), cwd=ROOT, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert (await asyncio.wait_for(client.stdout.readline(), 60)).decode().strip() == "Hello world!"
        client.send_signal(signum)
        returncode = await asyncio.wait_for(client.wait(), 5)  # Dynamo 1.6.1: 0.3 s
        assert returncode in (-signum, 1, 128 + signum), returncode  # ended by the signal, not by itself
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()
        await worker.stop(timeout=10)


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
async def test_sigterm_ends_a_dynamo_worker_after_it_left_discovery(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """SIGTERM ends a worker with no handler of its own by SIGTERM, as on Dynamo, and its instance
    is gone from discovery by then (not after its lease expires): no caller routes to it."""
    env = use_environment(monkeypatch, services, tmp_path, mode)
    worker = await serve_program(SHAPED / "hello_world.py", "hello_world.backend.generate", env, tmp_path)
    watcher = DistributedRuntime(asyncio.get_running_loop(), "etcd", False)
    try:
        client = await watcher.endpoint("hello_world.backend.generate").client()
        assert worker.instance_id in await client.wait_for_instances(timeout=10)
        worker.send_signal(signal.SIGTERM)
        assert await worker.wait(timeout=5) == -signal.SIGTERM
        for _ in range(40):
            if worker.instance_id not in client.instance_ids():
                break
            await asyncio.sleep(0.05)
        assert worker.instance_id not in client.instance_ids()  # within 2 s; a lease takes 10
    finally:
        await watcher.shutdown_async()


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
async def test_a_dynamo_program_keeps_the_signal_handler_it_installed(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """A program that installs its own SIGTERM handler right after creating the runtime (as
    Dynamo's frontend does) keeps it: its drain runs and it exits 0."""
    env = use_environment(monkeypatch, services, tmp_path, mode)
    server = await serve_program(
        SHAPED / "server_with_own_handler.py", "hello_world.backend.generate", env, tmp_path
    )
    server.send_signal(signal.SIGTERM)
    assert await server.wait(timeout=10) == 0, server.logs()
    assert "drained" in server.logs(), server.logs()


@pytest.mark.parametrize("mode", ["etcd-tcp", "etcd-nats", "file-tcp"])
async def test_unary_clients_get_one_answer_per_call(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """``serve_unary_endpoint`` and ``UnaryClient``, ``LLMUnaryClient`` over a token engine, and
    the errors Dynamo 1.6.1 gives, after the items before them: no answer is a RuntimeError, n=2 a
    ValueError; a handler's RuntimeError("boom"), its CancelledError and a handler that stopped its
    own request and returned are ValueErrors with Dynamo's messages, and the instance stays."""
    env = use_environment(monkeypatch, services, tmp_path, mode)
    worker = await serve_program(SHAPED / "unary_worker.py", "calc.tokens.generate", env, tmp_path)
    try:
        printed = await run_program(SHAPED / "unary_client.py", env=env)
        expected = [
            "sum 5 req-7",
            "metadata {'user': 'a'}",
            "silent: unary endpoint returned no response",
            "boom: ['first'] 'Internal: RuntimeError: boom' 1",
            "short: ['one'] 'Unavailable: Stream ended before generation completed' 1",
            "giveup: ['one'] 'Cancelled: CancelledError: ' 1",  # the instance stays
            "tokens [8, 7, 6] length",
            "n=2: LLMUnaryClient requires n=1",
        ]
        if sys.version_info < (3, 11):  # 3.10 cannot tell a handler's CancelledError from a cancel
            expected = [line for line in expected if not line.startswith("giveup")]
            printed = [line for line in printed if not line.startswith("giveup")]
        assert printed == expected
    finally:
        await worker.stop(timeout=10)


def cancelled(lines: list[str]) -> bool:
    return any("Server: Cancelled at iteration" in line for line in lines)


@pytest.mark.parametrize("through", ["server", "middle"])
async def test_stopping_a_dynamo_request_reaches_the_server(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    env = use_environment(monkeypatch, services, tmp_path, "etcd-tcp")
    server = await serve_program(SHAPED / "cancellation_server.py", "demo.server.generate", env, tmp_path)
    middle = None
    try:
        if through == "middle":
            middle = await serve_program(
                SHAPED / "cancellation_middle.py", "demo.middle.generate", env, tmp_path
            )
        args = ["--middle"] if through == "middle" else []
        printed = await run_program(SHAPED / "cancellation_client.py", *args, env=env)
        received = [line for line in printed if line.startswith("Client: Received")]
        assert received == ["Client: Received 0", "Client: Received 1", "Client: Received 2"]
        assert printed[-1] == "Client: Done"
        for _ in range(100):  # the stop crossed the wire (twice, through the middle server)
            if cancelled(server.logs()):
                break
            await asyncio.sleep(0.05)
        assert cancelled(server.logs()), server.logs()
    finally:
        for process in (middle, server):
            if process is not None:
                await process.stop(timeout=10)


async def test_client_options_context_ids_and_handler_shapes_as_dynamos(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``annotated=False``, ``Context(id)``, a keyword-only ``context``, a method endpoint and a
    pydantic request sent as a JSON string, in one process."""
    import pydantic

    monkeypatch.setenv("DYN_NB_DISCOVERY", "memory")

    class Question(pydantic.BaseModel):
        text: str

    seen: list[str] = []

    async def keyword_context(request, *, context):
        seen.append(context.id())
        yield request.upper()

    class Handlers:
        prefix = "re: "

        @dynamo_endpoint(Question, str)
        async def answer(self, request: Question, context):
            seen.append(context.id())
            yield self.prefix + request.text

    runtime = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp", False)
    upper = runtime.endpoint("demo.shapes.upper")
    answer = runtime.endpoint("demo.shapes.answer")
    loop = asyncio.get_running_loop()
    serving = [
        loop.create_task(upper.serve_endpoint(keyword_context)),
        loop.create_task(answer.serve_endpoint(Handlers().answer)),
    ]
    try:
        upper_client, answer_client = await upper.client(), await answer.client()
        await upper_client.wait_for_instances()
        await answer_client.wait_for_instances()
        bare = [
            item
            async for item in await upper_client.generate("hi", annotated=False, context=Context("req-7"))
        ]
        assert bare == ["HI"]
        items = [item async for item in await answer_client.round_robin(Question(text="x").model_dump_json())]
        assert [item.data() for item in items] == ["re: x"] and not items[0].is_error()
        assert seen[0] == "req-7" and len(seen) == 2
    finally:
        await runtime.shutdown_async()
        await asyncio.wait_for(asyncio.gather(*serving), 10)


def test_an_unknown_discovery_backend_is_a_clear_error() -> None:
    from dynamo_nb.errors import ConfigError

    with pytest.raises(ConfigError, match="use 'etcd', 'file' or 'mem'"):
        DistributedRuntime(None, "etcdd", "tcp")


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


async def test_a_model_registered_after_its_endpoint_serves_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo's examples may ``gather(serve_endpoint(...), register_model(...))``: either order works."""
    from dynamo_nb.compat.llm import ModelInput, ModelType, WorkerType, register_model
    from dynamo_nb.frontend import Frontend
    from dynamo_nb.models import tiny_model_path

    monkeypatch.setenv("DYN_NB_DISCOVERY", "memory")

    async def generate(request: dict[str, Any]):
        yield {"token_ids": request["token_ids"][:1], "finish_reason": "length"}

    runtime = DistributedRuntime(asyncio.get_running_loop(), "mem")
    endpoint = runtime.endpoint("dynamo.late.generate")
    serving = asyncio.get_running_loop().create_task(endpoint.serve_endpoint(generate))
    frontend = await Frontend.start(await runtime.inner(), port=0)
    try:
        await (await endpoint.client()).wait_for_instances(timeout=10)
        card = await register_model(
            model_input=ModelInput.Tokens,
            model_type=ModelType.Chat,
            endpoint=endpoint,
            model_path=tiny_model_path(),
            model_name="late",
            worker_type=WorkerType.Aggregated,
        )
        assert card.kinds == ["chat"]
        await frontend.wait_for_model("late", timeout=10)
    finally:
        await frontend.stop()
        await runtime.shutdown_async()
        await asyncio.wait_for(serving, 10)
