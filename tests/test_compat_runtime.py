"""Programs written against Dynamo's ``dynamo.runtime`` API run on dynamo_nb with one import line
changed (tests/dynamo_shaped/: our own programs in the shape of Dynamo's hello_world and
cancellation examples), in one process and as processes over etcd + TCP, etcd + NATS and a folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aetcd
import httpx
import pytest
from helpers import ROOT

from dynamo_nb import launch
from dynamo_nb.compat.runtime import Context, DistributedRuntime, dynamo_endpoint

pytestmark = pytest.mark.timeout(120)

SHAPED = ROOT / "tests" / "dynamo_shaped"
# Seconds a program gets to end after a signal it must end on: far above a busy machine's delay
# (Dynamo 1.6.1 takes 0.3 s), while a program that ignores the signal never ends and fails it.
SIGNALLED_EXIT_WITHIN = 60.0


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


async def test_a_stopped_dynamo_request_ends_for_the_caller_and_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on Dynamo 1.6.1: after ``stop_generating()`` the caller's stream yields nothing more,
    and a handler that ignores the stop is closed at the second item it yields after it
    (GeneratorExit at that yield), so a check at the top of its loop still runs once."""
    monkeypatch.setenv("DYN_NB_DISCOVERY", "memory")
    seen: list[str] = []

    async def ignores_the_stop(request, context):
        try:
            for i in range(50):
                yield i
                await asyncio.sleep(0.05)
            seen.append("ran to the end")
        except GeneratorExit:
            seen.append(f"closed, stopped={context.is_stopped()}")
            raise

    runtime = DistributedRuntime(asyncio.get_running_loop(), "mem", "tcp", False)
    endpoint = runtime.endpoint("demo.ignores.generate")
    serving = asyncio.get_running_loop().create_task(endpoint.serve_endpoint(ignores_the_stop))
    try:
        client = await endpoint.client()
        await client.wait_for_instances()
        context = Context()
        received = []
        async for response in await client.generate("x", context=context):
            received.append(response.data())
            if len(received) == 2:
                context.stop_generating()
        assert received == [0, 1]
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == ["closed, stopped=True"]
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
    context.metadata = {"user": "b"}  # replaceable, as Dynamo 1.6.1's is
    assert context.metadata == {"user": "b"}
    with pytest.raises(TypeError, match="must be a dict"):
        context.metadata = "user=b"  # type: ignore[assignment]


def environments(services: Any, tmp_path: Path) -> dict[str, dict[str, str]]:
    etcd = {"ETCD_ENDPOINTS": "http://" + services.etcd_url.removeprefix("etcd://"), "DYN_NB_DISCOVERY": ""}
    return {
        "etcd-tcp": etcd,
        "etcd-nats": {**etcd, "DYN_REQUEST_PLANE": "nats", "NATS_SERVER": services.nats_url},
        "file-tcp": {"DYN_NB_DISCOVERY": f"file://{tmp_path / 'kv'}"},
    }


async def stored_instance_keys(services: Any, tmp_path: Path, mode: str) -> str:
    """Every instance record the discovery store of ``mode`` holds now, as one text."""
    if mode.startswith("file"):
        return " ".join(unquote(path.name) for path in (tmp_path / "kv" / "keys").iterdir())
    host, port = services.etcd_url.removeprefix("etcd://").split(":")
    async with aetcd.Client(host=host, port=int(port)) as etcd:
        return " ".join(kv.key.decode() for kv in await etcd.get_prefix(b"v1/instances/"))


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


@contextlib.contextmanager
def sigint_ignored(ignored: bool) -> Iterator[None]:
    """This process ignores SIGINT while the block runs (when ``ignored``), as a Jupyter kernel
    does and as every background job of a non-interactive shell starts (``python -m pytest &``)."""
    if not ignored:
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize(
    ("mode", "signum", "launcher_ignores_sigint"),
    [
        *(
            (mode, signum, False)
            for mode in ("etcd-tcp", "etcd-nats", "file-tcp")
            for signum in (signal.SIGINT, signal.SIGTERM)
        ),
        ("file-tcp", signal.SIGINT, True),  # the disposition does not depend on the planes
    ],
    ids=[
        *(
            f"{name}-{mode}"
            for mode in ("etcd-tcp", "etcd-nats", "file-tcp")
            for name in ("ctrl-c", "sigterm")
        ),
        "ctrl-c-launched-by-a-process-ignoring-it-file-tcp",
    ],
)
async def test_a_signal_ends_a_looping_dynamo_client(
    services: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    signum: int,
    launcher_ignores_sigint: bool,
) -> None:
    """As on Dynamo 1.6.1, whose runtime installs no signal handler: Ctrl-C (KeyboardInterrupt)
    and SIGTERM end a client whose loop never returns by itself, within seconds; also when the
    process that launched it ignores SIGINT (an ignored signal is inherited, and Python turns
    only a default SIGINT into KeyboardInterrupt: the launcher gives its programs the defaults)."""
    env = use_environment(monkeypatch, services, tmp_path, mode, DYN_TEST_HELLO_WORLD_WORD_DELAY_SEC="0.01")
    worker = await serve_program(SHAPED / "hello_world.py", "hello_world.backend.generate", env, tmp_path)
    try:
        with sigint_ignored(launcher_ignores_sigint):
            client = await launch(
                SHAPED / "looping_client.py", env=env, cwd=ROOT, log_dir=tmp_path, show_logs=False,
                ready=r"^Hello world!$", timeout=60,
            )  # fmt: skip
        try:
            client.send_signal(signum)
            # Dynamo 1.6.1 ends in 0.3 s; one that ignores the signal never ends (the loop is endless)
            returncode = await client.wait(timeout=SIGNALLED_EXIT_WITHIN)
            assert returncode in (-signum, 1, 128 + signum), returncode  # ended by the signal, not by itself
            if signum == signal.SIGINT:
                assert any("KeyboardInterrupt" in line for line in client.logs()), client.tail()
        finally:
            await client.stop(timeout=5)
    finally:
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
        assert await worker.wait(timeout=SIGNALLED_EXIT_WITHIN) == -signal.SIGTERM
        # it deleted its record before it exited: the store no longer has it now (a record
        # left for its lease to expire would still be there for 10 s)
        assert f"{worker.instance_id:x}" not in await stored_instance_keys(services, tmp_path, mode)

        async def the_watch_hears_it() -> None:
            while True:
                if worker.instance_id not in client.instance_ids():
                    return
                await asyncio.sleep(0.05)

        await asyncio.wait_for(the_watch_hears_it(), SIGNALLED_EXIT_WITHIN)
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


def cancellations(server: Any) -> int:
    """How many requests the cancellation server saw stopped so far."""
    return sum("Server: Cancelled at iteration" in line for line in server.logs())


# Seconds from the moment a caller lets a request go until the server sees it stopped. On Dynamo
# 1.6.1 and here the stop arrives within one server iteration (0.1 s); a stop that is lost is
# seen only when the server's 1000 iterations end (100 s). The bound lies far from both, so a
# busy machine never fails it and a lost stop always does.
STOP_SEEN_WITHIN = 30.0

HOW_A_CALLER_LETS_GO = {
    "etcd-tcp": [("server", "stop"), ("server", "break"), ("server", "exit"), ("server", "die"),
                 ("server", "pre-stopped"), ("middle", "stop"), ("middle", "die")],
    "etcd-nats": [("server", "stop"), ("server", "break"), ("server", "exit"), ("server", "die"),
                  ("server", "pre-stopped"), ("middle", "stop"), ("middle", "die")],
    "file-tcp": [("server", "stop"), ("server", "pre-stopped"), ("middle", "stop"), ("middle", "die")],
}  # fmt: skip


async def let_go_of_a_request(server: Any, env: dict[str, str], through: str, how: str) -> None:
    """Run the cancellation client; the server must see the request stopped within the bound."""
    seen_before = cancellations(server)
    args = ["--how", how] + (["--middle"] if through == "middle" else [])
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(SHAPED / "cancellation_client.py"), *args, cwd=ROOT, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    printed: list[str] = []
    try:
        last_line = "Client: Received 2" if how == "die" else "Client: Done"
        while not printed or printed[-1] != last_line:
            line = await asyncio.wait_for(client.stdout.readline(), 60)
            assert line, f"{how} via {through}: the client ended early: {printed}"
            printed.append(line.decode().rstrip())
        let_go = asyncio.get_running_loop().time()
        received = [line for line in printed if line.startswith("Client: Received")]
        if how == "pre-stopped":
            assert received == [], printed
        else:
            assert received == ["Client: Received 0", "Client: Received 1", "Client: Received 2"], printed
        while cancellations(server) == seen_before:
            waited = asyncio.get_running_loop().time() - let_go
            assert waited < STOP_SEEN_WITHIN, f"{how} via {through}: no stop after {waited:.1f} s"
            await asyncio.sleep(0.02)
        if how in ("stop", "exit", "pre-stopped"):
            try:
                assert await asyncio.wait_for(client.wait(), 30) == 0, (how, through, printed)
            except TimeoutError:
                client.send_signal(signal.SIGUSR1)  # the client prints its threads' stacks
                await asyncio.sleep(2)
                client.kill()
                stacks = await asyncio.wait_for(client.stdout.read(), 10)
                raise AssertionError(
                    f"{how} via {through}: the client did not exit: {printed}\n{stacks.decode()}"
                ) from None
    finally:
        if client.returncode is None:
            client.kill()
            await client.wait()


@pytest.mark.parametrize(
    "mode", ["etcd-tcp", pytest.param("etcd-nats", marks=pytest.mark.long), "file-tcp"]
)  # NATS's case in the long group: the stop's path there is tested in test_cross_process too
async def test_a_request_its_caller_lets_go_of_stops_on_the_server(
    services: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """However a caller lets go of a request (stops it, breaks out, exits, dies, or stopped it
    before sending), directly or through a middle server, the server's handler sees it stopped
    within a bound on every plane: nothing relies on a task the caller may never run."""
    env = use_environment(monkeypatch, services, tmp_path, mode)
    server = await serve_program(SHAPED / "cancellation_server.py", "demo.server.generate", env, tmp_path)
    middle = None
    try:
        middle = await serve_program(SHAPED / "cancellation_middle.py", "demo.middle.generate", env, tmp_path)
        for through, how in HOW_A_CALLER_LETS_GO[mode]:
            await let_go_of_a_request(server, env, through, how)
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
    from dynamo_nb.compat.llm import ModelInput, ModelType, WorkerType, register_model, unregister_llm
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
        await unregister_llm(endpoint)  # the model goes, the endpoint stays
        async with httpx.AsyncClient(base_url=frontend.url, timeout=10) as http:
            for _ in range(100):
                if not (await http.get("/v1/models")).json()["data"]:
                    break
                await asyncio.sleep(0.02)
            assert (await http.get("/v1/models")).json()["data"] == []
        assert (await endpoint.client()).instance_ids()
        await register_model(ModelInput.Tokens, ModelType.Chat, endpoint, tiny_model_path(), "late")
        await frontend.wait_for_model("late", timeout=10)
    finally:
        await frontend.stop()
        await runtime.shutdown_async()
        await asyncio.wait_for(serving, 10)


# Dynamo 1.6.1's public names (ai-dynamo 1.6.1 from PyPI: ``dir()`` of each module and class, less
# what the modules import from the standard library, typing and pydantic).
DYNAMO_1_6_1 = {
    "dynamo.runtime": {
        "Client", "Context", "DistributedRuntime", "Endpoint", "PyAsyncRequestStream", "UnaryClient",
        "dynamo_endpoint", "dynamo_worker", "serve_unary_endpoint",
    },
    "dynamo.runtime.DistributedRuntime": {
        "detached", "endpoint", "event_loop", "register_engine_route", "set_health_status", "shutdown",
        "system_status_server_url", "to_capsule",
    },
    "dynamo.runtime.Endpoint": {
        "client", "connection_id", "first_token_source", "metrics", "register_endpoint_instance",
        "serve_bidirectional_endpoint", "serve_endpoint", "unregister_endpoint_instance",
    },
    "dynamo.runtime.Client": {
        "device_aware_weighted", "direct", "generate", "instance_ids", "instances", "random", "round_robin",
        "wait_for_instance_by_runtime_data", "wait_for_instances", "wait_for_instances_by_runtime_data",
    },
    "dynamo.runtime.Context": {
        "async_killed_or_stopped", "current_span", "detached", "id", "is_killed", "is_stopped", "metadata",
        "notify_first_token", "parent_span_id", "span_id", "start_span", "stop_generating", "trace_headers",
        "trace_id",
    },
    "dynamo.llm": {
        "AisPerfConfig", "EngineType", "EntrypointArgs", "FpmDirectPublisher", "FpmEventRelay",
        "FpmEventSubscriber", "FrontendExtensionContext", "FrontendResponse", "FrontendRoute",
        "HttpAsyncEngine", "HttpError", "HttpService", "KserveGrpcService", "KvDcRelay", "KvEventPublisher",
        "KvRouter", "KvRouterConfig", "KvStateAgentHost", "KvStateAttachmentOwner", "LLMUnaryClient",
        "LoRADownloader", "LoadThresholdConfig", "MediaDecoder", "MediaFetcher", "ModelCardInstanceId",
        "ModelInput", "ModelRuntimeConfig", "ModelType", "MultimodalEmbeddingCachePublisher",
        "OverlapScores", "PythonAsyncEngine", "RadixTree", "RoutedEngine", "RouterConfig", "RouterMode",
        "RouterQueueLimitExceeded", "RoutingConstraints", "SelectionService", "UnaryChatModel",
        "WorkerMetricsPublisher", "WorkerType", "compute_block_hash_for_seq", "exceptions", "fetch_llm",
        "fetch_model", "lora_name_to_id", "make_engine", "register_llm", "register_model", "run_input",
        "run_kv_indexer", "run_select_service", "run_slot_tracker", "unregister_llm", "unregister_model",
        "update_model_taints", "with_engine_data",
    },
}  # fmt: skip


def documented_names(docstring: str, heading: str) -> set[str]:
    """The ``names`` in the paragraph(s) of ``docstring`` that start with ``heading``, up to the next heading."""
    section = docstring.split(heading, 1)[1]
    section = re.split(r"\n(?:Added here|Not provided|Differences|Beside this module)", section, maxsplit=1)[
        0
    ]
    return set(re.findall(r"``([A-Za-z_][A-Za-z_.]*)``", section))


@pytest.mark.parametrize("module_name", ["runtime", "llm"])
def test_the_documented_differences_are_exactly_the_names_dynamo_has_and_we_lack(module_name: str) -> None:
    """Each compat module's docstring lists, under "Not provided", exactly the Dynamo 1.6.1 names
    (module names, and members of its classes) it lacks, and under "Added here" the names it has
    that Dynamo has not: a name added or dropped on either side fails until the docstring says so."""
    import importlib

    module = importlib.import_module(f"dynamo_nb.compat.{module_name}")
    ours = set(module.__all__)
    dynamo = DYNAMO_1_6_1[f"dynamo.{module_name}"]
    lacking = dynamo - ours
    for qualified, members in DYNAMO_1_6_1.items():
        owner, _, cls = qualified.removeprefix(f"dynamo.{module_name}").partition(".")
        if cls and not owner and cls in ours:
            have = {name for name in dir(getattr(module, cls)) if not name.startswith("_")}
            lacking |= {f"{cls}.{name}" for name in members - have}
    assert documented_names(module.__doc__, "Not provided") == lacking
    assert documented_names(module.__doc__, "Added here") == ours - dynamo
