"""A running OpenAI-compatible server behind the kit (`UpstreamEngine`, components/upstream_worker.py):
the server here is real, the kit's own ``python -m dynamo_nb run --in http --out hf`` in its own
process (vLLM's server is the peer in the vllm group); nothing is mocked.

What is checked: the engine passes the conformance suite against the server; greedy text through
the kit's frontend equals the server's own; a client that leaves frees the server's request; the
server's own 400 reaches the client as that 400; a server that is not there is a clear error.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import ROOT, free_port

from dynamo_nb import DistributedRuntime
from dynamo_nb.disagg.modes import WorkerRole
from dynamo_nb.engines import check_engine
from dynamo_nb.engines.engine_worker import serve_engine
from dynamo_nb.engines.upstream import UpstreamEngine
from dynamo_nb.errors import InvalidRequestError, LaunchError, NotReadyError
from dynamo_nb.frontend import Frontend
from dynamo_nb.launch import ManagedProcess, launch, launch_server, launch_upstream
from dynamo_nb.llm import ModelTokenizer, PreprocessedRequest, StopConditions
from dynamo_nb.models import tiny_model_path
from dynamo_nb.router.kv.router import KvRouterConfig

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

SMALL_CONTEXT = 256  # the server's model folder says so: prompts past it are the server's 400


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 256-token context (its own folder: the server's)."""
    folder = tmp_path_factory.mktemp("small") / "tiny-llama"
    shutil.copytree(tiny_model_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = SMALL_CONTEXT
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
async def server(
    small_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ManagedProcess]:
    """The upstream: the kit's own frontend and hf worker in one process, on a port of its own."""
    port = free_port()
    process = await launch(
        sys.executable, "-m", "dynamo_nb", "run", "--in", "http", "--out", "hf", "--http-port", port,
        "--model-path", small_model, cwd=ROOT, log_dir=tmp_path_factory.mktemp("logs"), show_logs=False,
        timeout=120, name="upstream",
    )  # fmt: skip
    process.url = f"http://127.0.0.1:{port}"
    yield process
    await process.stop(timeout=10)


async def connect(server: ManagedProcess) -> UpstreamEngine:
    assert server.url is not None
    return await UpstreamEngine.connect(
        server.url, tokenizer=ModelTokenizer.load(tiny_model_path()), timeout=60
    )


async def test_the_upstream_engine_passes_the_engine_contract(server: ManagedProcess) -> None:
    engine = await connect(server)
    try:
        assert (engine.model, engine.context_length) == ("tiny-llama", SMALL_CONTEXT)
        report = await check_engine(engine, timeout=60)
        assert report.passed, report
    finally:
        await engine.close()


async def test_the_servers_own_400_arrives_as_that_400(server: ManagedProcess) -> None:
    engine = await connect(server)
    assert server.url is not None
    too_long = {"model": "tiny-llama", "prompt": [450] * (SMALL_CONTEXT + 10), "max_tokens": 4}
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(f"{server.url}/v1/completions", json=too_long)
    assert direct.status_code == 400, direct.text
    try:
        request = PreprocessedRequest(
            token_ids=too_long["prompt"], stop_conditions=StopConditions(max_tokens=4)
        )
        with pytest.raises(InvalidRequestError) as refused:
            async for _ in engine.generate(request):
                pass
        assert refused.value.http_status == 400
        assert str(refused.value) == direct.json()["error"]["message"]
        assert engine.stats()["refused"] == 1
    finally:
        await engine.close()


class Kit:
    """The kit's frontend with an upstream worker in front of the server (one process, memory discovery)."""

    def __init__(self, runtime: DistributedRuntime, frontend: Frontend, engine: UpstreamEngine) -> None:
        self.runtime, self.frontend, self.engine = runtime, frontend, engine

    async def stop(self) -> None:
        await self.frontend.stop()
        await self.runtime.shutdown()
        await self.engine.close()


async def kit_in_front(server: ManagedProcess, *, card_context: int | None = None) -> Kit:
    """``card_context``: what the kit's card says of the context (None: the server's)."""
    engine = await connect(server)
    if card_context is not None:
        engine.context_length = card_context
    runtime = await DistributedRuntime.create()
    role = WorkerRole(endpoint="kit.upstream.generate")
    await serve_engine(runtime, role, tiny_model_path(), engine.model, lambda kv_events: engine)
    frontend = await Frontend.start(runtime, port=0)
    await frontend.wait_for_model(engine.model, timeout=30)
    return Kit(runtime, frontend, engine)


async def text_of(url: str, body: dict[str, Any]) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


async def test_through_the_kit_the_text_is_the_servers_and_its_400_passes(server: ManagedProcess) -> None:
    assert server.url is not None
    kit = await kit_in_front(
        server, card_context=2048
    )  # the kit lets long prompts through: the server judges
    try:
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Tell me about ships"}],
                "max_tokens": 12, "temperature": 0}  # fmt: skip
        assert await text_of(kit.frontend.url, body) == await text_of(server.url, body)
        async with httpx.AsyncClient(timeout=30) as http:
            too_long = {"model": "tiny-llama", "prompt": "word " * 400, "max_tokens": 4}
            direct = await http.post(f"{server.url}/v1/completions", json=too_long)
            through = await http.post(f"{kit.frontend.url}/v1/completions", json=too_long)
        assert (through.status_code, direct.status_code) == (400, 400), through.text
        assert through.json()["error"]["message"] == direct.json()["error"]["message"]
    finally:
        await kit.stop()


async def test_a_server_behind_the_kit_is_profiled_like_any_engine(
    server: ManagedProcess, tmp_path: Path
) -> None:
    """`bench.profile` through the kit's frontend measures the server it fronts: its first tokens,
    decode steps over batch and context (within the server's 256-token context) and what a cached
    prefix saves as the server reports it; the folder loads as a timing model."""
    from dynamo_nb import bench
    from dynamo_nb.engines.mocker_timing import ProfiledTiming, TimingProfile

    kit = await kit_in_front(server)
    try:
        measured = await bench.profile(kit.frontend.url, "tiny-llama", prefill_tokens=(16, 64, 128), batches=(1, 4),
                                       contexts=(32, 96), cached_prefixes=(64,), new_after_prefix=(16, 48),
                                       decode_tokens=8, repeats=1, progress=False)  # fmt: skip
    finally:
        await kit.stop()
    assert len(measured.prefill) + len(measured.prefill_after_prefix) == 5
    assert [(b, c) for b, c, _ in measured.decode] == [(1, 36.0), (1, 100.0), (4, 36.0), (4, 100.0)]
    assert all(ms > 0 for *_, ms in measured.decode) and measured.request_overhead_ms > 0
    model = ProfiledTiming.fit(TimingProfile.read(measured.write(tmp_path / "upstream")))
    assert model.decode_grid is not None and model.first_token_ms(64) > 0


async def inflight_at(url: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynamo_frontend_inflight_requests{")
    )


async def test_a_prefill_server_without_a_kv_connector_is_a_clear_error(server: ManagedProcess) -> None:
    """The prefill role asks the server as vLLM's disaggregated proxy does (one token,
    kv_transfer_params); a server that answers without kv_transfer_params (no KV connector, as
    this one) is a DisaggregationError saying what to start it with."""
    from dynamo_nb.errors import DisaggregationError

    engine = await connect(server)
    try:
        with pytest.raises(DisaggregationError, match="--kv-transfer-config"):
            async for _ in engine.prefill(PreprocessedRequest(token_ids=[1, 450, 318, 263])):
                pass
        assert engine.requests_total == 1 and engine.active == 0
    finally:
        await engine.close()


async def test_a_client_that_leaves_frees_the_servers_request(server: ManagedProcess) -> None:
    assert server.url is not None
    kit = await kit_in_front(server)
    try:
        body = {
            "model": "tiny-llama",
            "prompt": "a long story",
            "max_tokens": 200,
            "ignore_eos": True,
            "stream": True,
        }
        async with httpx.AsyncClient(base_url=kit.frontend.url, timeout=60) as http:
            async with http.stream("POST", "/v1/completions", json=body) as answer:
                assert answer.status_code == 200
                lines = answer.aiter_lines()
                for _ in range(3):
                    await anext(lines)
                assert await inflight_at(server.url) == 1
                load = await kit.engine.read_load()  # the server's own load, from its /metrics
                assert load["running"] == 1 and kit.engine.stats()["server_running"] == 1, load
        for _ in range(200):  # the connection is closed: the server's request too
            if await inflight_at(server.url) == 0 and kit.engine.active == 0:
                break
            await asyncio.sleep(0.05)
        assert await inflight_at(server.url) == 0 and kit.engine.active == 0
    finally:
        await kit.stop()


async def test_the_worker_program_and_run_put_a_server_behind_the_kit(
    server: ManagedProcess, tmp_path: Path
) -> None:
    """components/upstream_worker.py (served under the server's model name, found over a
    discovery folder by a kit frontend) and ``run --in http --out upstream=URL``: the server's text."""
    assert server.url is not None
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 8, "temperature": 0}  # fmt: skip
    expected = await text_of(server.url, body)
    where = f"file://{tmp_path / 'kv'}"
    worker = await launch_upstream(server, "--discovery", where, cwd=ROOT, log_dir=tmp_path, show_logs=False)
    port = free_port()
    one_process = await launch(
        sys.executable, "-m", "dynamo_nb", "run", "--in", "http", "--out", f"upstream={server.url}",
        "--http-port", port, cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=120, name="run-upstream",
    )  # fmt: skip
    runtime = await DistributedRuntime.create(where)
    frontend = await Frontend.start(runtime, port=0)
    try:
        assert worker.ready_line.endswith("model=tiny-llama"), worker.ready_line
        await frontend.wait_for_model("tiny-llama", timeout=30)
        assert await text_of(frontend.url, body) == expected
        assert await text_of(f"http://127.0.0.1:{port}", body) == expected
    finally:
        await frontend.stop()
        await runtime.shutdown()
        assert await worker.stop(timeout=10) == 0, worker.tail()
        assert await one_process.stop(timeout=10) == 0, one_process.tail()


async def test_launch_server_waits_for_an_answer_and_reports_one_that_exits(tmp_path: Path) -> None:
    """A server that prints no READY line is ready once it answers over HTTP; one that exits
    first is a LaunchError with its last lines."""
    port = free_port()
    server = await launch_server("-m", "dynamo_nb", "run", "--in", "http", "--out", "echo", "--http-port", port,
                                 url=f"http://127.0.0.1:{port}", cwd=ROOT, log_dir=tmp_path, show_logs=False,
                                 timeout=120, name="echo-server")  # fmt: skip
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(f"{server.url}/v1/models")).json()["data"][0]["id"] == "tiny-llama"
    finally:
        await server.stop(timeout=10)
    # the root cause is printed early and scrolls out of the last lines (vLLM's engine core fails so)
    crash = "print('(Core pid=7) OSError: [Errno 28] No space left'); [print('noise', i) for i in range(40)]; exit(3)"
    with pytest.raises(LaunchError, match=r"^bad-server exited with 3\n") as caught:
        await launch_server(sys.executable, "-c", crash, url=f"http://127.0.0.1:{free_port()}", log_dir=tmp_path,
                            show_logs=False, name="bad-server", timeout=30)  # fmt: skip
    assert caught.value.errors == ["(Core pid=7) OSError: [Errno 28] No space left"], str(caught.value)
    assert "No space left" in str(caught.value) and caught.value.log_tail.endswith("noise 39")
    assert "No space left" not in caught.value.log_tail and caught.value.returncode == 3


async def test_a_server_that_is_not_there_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NotReadyError, match=rf"the upstream server {url} did not list a model within 0.5 s"):
        await UpstreamEngine.connect(url, timeout=0.5)


class Fleet:
    """Servers (``run --out mocker``, each its own process), an upstream worker each (their own
    runtimes over a discovery folder), and the kit's frontend in front."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.where = tmp_path, f"file://{tmp_path / 'kv'}"
        self.servers: list[ManagedProcess] = []
        self.runtimes: list[DistributedRuntime] = []
        self.engines: list[UpstreamEngine] = []
        self.front: DistributedRuntime | None = None
        self.frontend: Frontend | None = None
        self.watching: list[asyncio.Task[None]] = []

    async def start_server(self, index: int, port: int, speedup: str) -> ManagedProcess:
        return await launch(
            sys.executable, "-m", "dynamo_nb", "run", "--in", "http", "--out", "mocker", "--http-port", port,
            "--speedup-ratio", speedup, cwd=ROOT, log_dir=self.tmp_path, show_logs=False, timeout=120,
            name=f"server{index}",
        )  # fmt: skip

    async def start(self, count: int, speedup: str, *, watch: float = 0, **frontend: Any) -> Frontend:
        for index in range(count):
            port = free_port()
            self.servers.append(await self.start_server(index, port, speedup))
            runtime = await DistributedRuntime.create(self.where)
            engine = await UpstreamEngine.connect(f"http://127.0.0.1:{port}", timeout=30)
            worker = await serve_engine(
                runtime, WorkerRole(), tiny_model_path(), engine.model, lambda kv_events, e=engine: e
            )
            if watch:  # in discovery only while the server answers
                self.watching.append(engine.watch(worker.server, watch))
            self.runtimes.append(runtime)
            self.engines.append(engine)
        self.front = await DistributedRuntime.create(self.where)
        self.frontend = await Frontend.start(self.front, port=0, **frontend)
        await self.frontend.wait_for_model("tiny-llama", timeout=30)
        client = self.frontend.models.get("tiny-llama").client
        for _ in range(200):
            if len(client.instance_ids()) == count:
                break
            await asyncio.sleep(0.05)
        assert len(client.instance_ids()) == count
        return self.frontend

    def server_of(self, instance_id: int) -> ManagedProcess:
        return self.servers[[runtime.connection_id for runtime in self.runtimes].index(instance_id)]

    async def stop(self) -> None:
        for task in self.watching:
            task.cancel()
        if self.frontend is not None:
            await self.frontend.stop()
        for runtime in [*([self.front] if self.front else []), *self.runtimes]:
            await runtime.shutdown()
        for engine in self.engines:
            await engine.close()
        for server in self.servers:
            await server.stop(timeout=10)


async def test_a_server_killed_mid_stream_hands_the_stream_to_another(tmp_path: Path) -> None:
    """Two servers (simulated engines at real speed), an upstream worker each, the kit's frontend in
    front: the server serving a stream is SIGKILLed mid-stream; the client's stream carries on
    on the other (migration) to every token asked for, and the dead server's instance is skipped."""
    fleet = Fleet(tmp_path)
    try:
        frontend = await fleet.start(2, "1")
        client = frontend.models.get("tiny-llama").client
        body = {"model": "tiny-llama", "prompt": "a long story", "max_tokens": 120, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        async with httpx.AsyncClient(base_url=frontend.url, timeout=120) as http:
            async with http.stream("POST", "/v1/completions", json=body) as answer:
                assert answer.status_code == 200
                serving = int(answer.headers["x-dynamo-decode-worker"], 16)
                victim = fleet.server_of(serving)
                chunks, usage = 0, None
                async for line in answer.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
                    chunks += bool(event["choices"] and event["choices"][0]["text"])
                    if chunks == 10 and victim.running:
                        victim.send_signal(signal.SIGKILL)  # the connection to it breaks mid-stream
        assert usage is not None and usage["completion_tokens"] == 120, usage  # one stream, all of it
        assert not victim.running and serving in client.down_ids()
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            metrics = (await http.get("/metrics")).text
            assert 'dynamo_frontend_migrations_total{model="tiny-llama"} 1.0' in metrics  # moved once
            for _ in range(4):  # later requests: the living server
                again = await http.post(
                    "/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 4}
                )
                assert again.status_code == 200, again.text
    finally:
        await fleet.stop()


async def test_a_worker_leaves_discovery_while_its_server_is_down_and_comes_back(tmp_path: Path) -> None:
    """The worker asks its server every 0.2 s: the server killed, its instance leaves the frontend's
    /health; the server started again on the same port, the same instance comes back and serves."""
    fleet = Fleet(tmp_path)
    try:
        frontend = await fleet.start(2, "10", watch=0.2)
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:

            async def listed() -> list[int]:
                health = (await http.get("/health")).json()
                return sorted(int(entry["instance_id"], 16) for entry in health["instances"])

            async def until_listed(expected: list[int]) -> None:
                for _ in range(300):
                    if await listed() == expected:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"/health lists {await listed()}, not {expected}")

            ids = sorted(runtime.connection_id for runtime in fleet.runtimes)
            await until_listed(ids)
            port = int(fleet.engines[0].url.rsplit(":", 1)[1])
            fleet.servers[0].send_signal(signal.SIGKILL)
            await until_listed([fleet.runtimes[1].connection_id])  # it left, no request needed
            for _ in range(4):
                answer = await http.post(
                    "/v1/completions", json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}
                )
                assert (
                    answer.status_code == 200
                    and answer.headers["x-dynamo-decode-worker"]
                    == f"{ids[ids.index(fleet.runtimes[1].connection_id)]:x}"
                )
            fleet.servers[0] = await fleet.start_server(0, port, "10")
            await until_listed(ids)  # the same instance, back
    finally:
        await fleet.stop()


async def test_least_loaded_routing_counts_what_a_server_runs_for_others(tmp_path: Path) -> None:
    """Two servers, one kept busy by clients that ask it directly (not through the kit): the worker
    reads its server's /metrics, the frontend its worker's stats, and least-loaded routing sends
    the kit's requests to the idle server, its decision naming the busy server's other requests."""
    fleet = Fleet(tmp_path)
    busy: list[asyncio.Task[Any]] = []
    try:
        frontend = await fleet.start(2, "1", watch=0.2, router_mode="least-loaded", server_load_interval=0.2)
        router = frontend.models.get("tiny-llama").router
        loaded, idle = (runtime.connection_id for runtime in fleet.runtimes)
        body = {"model": "tiny-llama", "prompt": "a long story", "max_tokens": 1000, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=fleet.engines[0].url, timeout=300) as direct:
            busy = [asyncio.create_task(direct.post("/v1/completions", json=body)) for _ in range(4)]
            for _ in range(600):  # the server's load reaches the router (two asks of 0.2 s apart)
                if (router.others_on(loaded) or 0) >= 4:
                    break
                await asyncio.sleep(0.05)
            assert not any(task.done() for task in busy), [task.result().text for task in busy if task.done()]
            assert router.others_on(loaded) == 4 and router.others_on(idle) == 0
            async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
                ask = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2,
                       "nvext": {"extra_fields": ["routing"]}}  # fmt: skip
                for _ in range(6):
                    answer = await http.post("/v1/completions", json=ask)
                    assert answer.status_code == 200, answer.text
                    assert answer.headers["x-dynamo-decode-worker"] == f"{idle:x}"
                # a server's gauge may still hold a request of ours that just ended: once a read
                # after they all ended has reached the router, the idle server runs none for others
                for _ in range(600):
                    if router.others_on(idle) == 0:
                        break
                    await asyncio.sleep(0.05)
                answer = await http.post("/v1/completions", json=ask)
                assert answer.headers["x-dynamo-decode-worker"] == f"{idle:x}", answer.text
                routing = answer.json()["nvext"]["routing"]["decode"]
            parts = {c["instance_id"]: c["parts"] for c in routing["candidates"]}
            assert parts[loaded]["server_others"] == 4 and parts[idle]["server_others"] == 0, routing
    finally:
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
        await fleet.stop()


def test_others_on_a_server_are_counted_at_the_moments_they_were_read() -> None:
    """A worker reads its server's /metrics now and then, and the router asks the worker later: a
    request of the kit that ran when the server was read and ended before the answer is not
    someone else's; clients outside the kit and other frontends' requests are."""
    from dynamo_nb.router.server_load import ServerLoad

    stats = {"server_running": 1.0, "server_waiting": 0.0, "active": 0, "active_at_check": 1}
    assert ServerLoad.from_stats(stats, routed=0, at=0.0).others == 0  # ours, read before it ended
    assert ServerLoad(running=5, routed=1, active=1, active_at_check=1).others == 4  # outside the kit
    assert ServerLoad(running=3, routed=1, active=3, active_at_check=3).others == 2  # other frontends'
    assert ServerLoad(running=6, waiting=2, routed=3).others == 5  # a worker that does not say: as before


async def test_a_request_of_the_kit_that_starts_and_ends_while_the_server_is_read_counts_as_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server may count a request that started after the read of its /metrics began and ended
    before the read returned: the engine counts it among its own then, not as someone else's."""
    from dynamo_nb.engines import upstream

    engine = upstream.UpstreamEngine("http://127.0.0.1:9", "tiny-llama")

    async def read_while_one_runs(url: str, **_: Any) -> tuple[int, bytes]:
        engine.requests_total += 1  # what _stream does as a request starts ...
        engine.active += 1
        engine.active -= 1  # ... and as it ends, all before the answer comes
        return 200, b"vllm:num_requests_running 1\n"

    monkeypatch.setattr(upstream, "fetch", read_while_one_runs)
    await engine.read_load()
    assert engine.active == 0 and engine.active_at_check == 1, vars(engine)


def reuse_funnel(metrics: str) -> dict[str, float]:
    """The frontend's KV reuse funnel (prompt tokens by stage) from its /metrics."""
    funnel = {}
    for line in metrics.splitlines():
        if line.startswith('dynamo_frontend_kv_reuse_tokens_total{model="tiny-llama"'):
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            funnel[stage] = float(line.rsplit(" ", 1)[1])
    return funnel


async def test_approximate_kv_routing_over_servers_sends_a_repeat_to_its_holder(tmp_path: Path) -> None:
    """Without KV events (Dynamo's --no-kv-events): the router remembers where it sent each prompt's
    blocks, so each repeat of a long prompt goes to the server that served it first, which reports
    the prefix cached; the funnel sets what the router predicted beside what the servers reused."""
    fleet = Fleet(tmp_path)
    try:
        frontend = await fleet.start(2, "10", router_mode="kv", kv=KvRouterConfig(use_kv_events=False))
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            for group in range(3):
                prompt = f"group {group}: " + "the harbour keeps its ships in rows, " * 20
                body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2}
                served = []
                for _ in range(3):
                    answer = await http.post("/v1/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    served.append((answer.headers["x-dynamo-decode-worker"],
                                   answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]))  # fmt: skip
                assert len({worker for worker, _ in served}) == 1, served  # every repeat to the holder
                assert served[0][1] == 0 and all(cached > 0 for _, cached in served[1:]), served
            funnel = reuse_funnel((await http.get("/metrics")).text)
        assert funnel["chosen_prefix"] > 0 and funnel["reused"] > 0, funnel
        error = abs(funnel["chosen_prefix"] - funnel["reused"]) / funnel["reused"]
        print(f"approximate routing: predicted {funnel['chosen_prefix']:.0f} prompt tokens cached, the servers "
              f"reused {funnel['reused']:.0f} ({error:.0%} apart)")  # fmt: skip
        assert error < 0.5, (
            funnel
        )  # the router's memory and the servers' caches agree, within a block a prompt
    finally:
        await fleet.stop()
