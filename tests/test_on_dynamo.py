"""The kit's programs on NVIDIA Dynamo's own runtime (``--runtime dynamo``), behind Dynamo's own
frontend (``python -m dynamo.frontend``): the same greedy text as on the kit's runtime.

The ``dynamo`` group needs Dynamo's packages (``python3 -m dynamo_nb install dynamo``); without
them it skips, saying so. The flag mapping and the missing-package error run everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from dynamo_nb import DistributedRuntime, bench
from dynamo_nb.errors import ConfigError
from dynamo_nb.extras import extra_installed
from dynamo_nb.frontend import Frontend
from dynamo_nb.launch import launch
from dynamo_nb.llm import serve_llm
from dynamo_nb.on_dynamo import DynamoPlanes, launch_dynamo_frontend
from dynamo_nb.runtime.addresses import free_port

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tiny-llama"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the sea and the ships on it"}],
    "max_tokens": 12,
    "temperature": 0,
}


def test_the_runtime_flags_become_dynamos_settings() -> None:
    etcd = DynamoPlanes.from_flags(
        "etcd://127.0.0.1:2379", "nats", "nats://127.0.0.1:4222", tcp_host="10.0.0.5"
    )
    assert (etcd.discovery_backend, etcd.request_plane, etcd.event_plane) == ("etcd", "nats", "nats")
    assert etcd.environment["ETCD_ENDPOINTS"] == "http://127.0.0.1:2379"
    assert etcd.environment["NATS_SERVER"] == "nats://127.0.0.1:4222"
    assert etcd.environment["DYN_TCP_RPC_HOST"] == "10.0.0.5"
    folder = DynamoPlanes.from_flags("file:///tmp/kv", None, None, tcp_host=None)
    assert folder.environment["DYN_FILE_KV"] == "/tmp/kv" and folder.event_plane == "zmq"
    assert "DYN_FILE_KV=/tmp/kv" in folder.describe()
    for discovery in ("memory", "static"):  # Dynamo's frontend is another process: it could not see them
        with pytest.raises(ConfigError, match=r"file://DIR.*etcd://HOST:PORT"):
            DynamoPlanes.from_flags(discovery, None, None, tcp_host=None)
    with pytest.raises(ConfigError, match="--nats-url"):
        DynamoPlanes.from_flags("file:///tmp/kv", "nats", None, tcp_host=None)


def test_each_leg_logs_its_room_and_a_fingerprint_of_its_token(caplog: pytest.LogCaptureFixture) -> None:
    """Dynamo's ``handoff_id`` becomes the room's token; at debug a leg logs its room and a
    fingerprint both legs share (a hash: nothing of the token itself); at info nothing."""
    import hashlib

    from dynamo_nb.on_dynamo.worker import log_handoff, with_handoff_token

    request = with_handoff_token({"bootstrap_info": {"bootstrap_room": 7, "handoff_id": list(range(16))}})
    token = request["bootstrap_info"]["bootstrap_token"]
    assert token == bytes(range(16)).hex()
    with caplog.at_level("INFO", logger="dynamo_nb.on_dynamo.worker"):
        log_handoff(request, "prefill")
    assert not caplog.records
    with caplog.at_level("DEBUG", logger="dynamo_nb.on_dynamo.worker"):
        log_handoff(request, "prefill")
        log_handoff(request, "decode")
        log_handoff({"token_ids": [1]}, "aggregated")
    fingerprint = hashlib.sha256(token.encode()).hexdigest()[:8]
    assert [r.getMessage() for r in caplog.records] == [
        f"{leg} leg of bootstrap room 7: token fingerprint {fingerprint} (from Dynamo's handoff_id)"
        for leg in ("prefill", "decode")
    ]
    assert not any(token[i : i + 6] in r.getMessage() for r in caplog.records for i in range(0, 27))


def test_dynamos_listeners_keep_to_loopback_unless_allowed_and_kv_events_need_nats(tmp_path: Path) -> None:
    """Dynamo's planes have no cluster secret: off loopback they are refused unless
    --allow-unauthenticated; KV events go over NATS, or over ZMQ (which binds every interface)
    only where that is allowed."""
    folder = f"file://{tmp_path / 'kv'}"
    DynamoPlanes.from_flags(folder, None, None, tcp_host=None).check_listeners()
    for host, flag in (("0.0.0.0", "--tcp-host"), ("198.18.0.7", "--tcp-host")):
        with pytest.raises(ConfigError, match=f"would listen on {host}.*keep {flag} on loopback"):
            DynamoPlanes.from_flags(folder, None, None, tcp_host=host).check_listeners()
    with pytest.raises(ConfigError, match=r"Dynamo's system server would listen on 0\.0\.0\.0"):
        DynamoPlanes.from_flags(folder, None, None, tcp_host=None, system_host="0.0.0.0").check_listeners()
    DynamoPlanes.from_flags(
        folder, None, None, tcp_host="0.0.0.0", allow_unauthenticated=True
    ).check_listeners()
    assert not DynamoPlanes.from_flags(folder, None, None, tcp_host=None).kv_events_allowed
    assert DynamoPlanes.from_flags(folder, None, "nats://127.0.0.1:4222", tcp_host=None).kv_events_allowed
    assert DynamoPlanes.from_flags(
        folder, None, None, tcp_host=None, allow_unauthenticated=True
    ).kv_events_allowed


def test_the_system_port_is_the_workers_and_not_its_frontends(tmp_path: Path) -> None:
    """--system-port becomes Dynamo's DYN_SYSTEM_PORT (its /health ready once the worker's
    generate endpoint serves); none without it; the frontend's environment carries neither."""
    folder = f"file://{tmp_path / 'kv'}"
    assert "DYN_SYSTEM_PORT" not in DynamoPlanes.from_flags(folder, None, None, tcp_host=None).environment
    planes = DynamoPlanes.from_flags(folder, None, None, tcp_host=None, system_port=9090)
    assert planes.environment["DYN_SYSTEM_PORT"] == "9090"
    assert planes.environment["DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"] == '["generate"]'
    workers_only = {"DYN_SYSTEM_PORT", "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"}
    assert not workers_only & set(planes.frontend_environment())
    with pytest.raises(
        ConfigError, match=r"--system-port 40000: Dynamo 1\.6\.1 reads DYN_SYSTEM_PORT as a 16-bit"
    ):
        DynamoPlanes.from_flags(folder, None, None, tcp_host=None, system_port=40000)


def test_a_folder_of_the_kits_runtime_is_refused_by_dynamos(tmp_path: Path) -> None:
    (tmp_path / "leases").mkdir()
    (tmp_path / "keys").mkdir()
    with pytest.raises(ConfigError, match=r"the kit's runtime's discovery folder.*a folder of its own"):
        DynamoPlanes.from_flags(f"file://{tmp_path}", None, None, tcp_host=None)


def test_the_frontend_command_matches_the_workers_settings() -> None:
    planes = DynamoPlanes.from_flags("etcd://127.0.0.1:2379", "nats", "nats://127.0.0.1:4222", tcp_host=None)
    kit = shlex.split(planes.frontend_command(9000, kit=True))
    assert kit == [sys.executable, "-m", "dynamo_nb", "dynamo-frontend", "--discovery", "etcd://127.0.0.1:2379",
                   "--nats-url", "nats://127.0.0.1:4222", "--request-plane", "nats", "--http-port", "9000"]  # fmt: skip
    spelled = shlex.split(planes.frontend_command(9000))
    settings = dict(word.split("=", 1) for word in spelled[: spelled.index(sys.executable)])
    assert settings == planes.frontend_environment() and settings["DYN_HTTP_HOST"] == "127.0.0.1"
    assert spelled[spelled.index(sys.executable) :] == [
        sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", "9000"
    ]  # fmt: skip


@pytest.mark.processes
@pytest.mark.skipif(extra_installed("dynamo"), reason="Dynamo's packages are installed here")
def test_without_dynamo_the_kits_dynamo_frontend_command_is_one_line_and_exit_2() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "dynamo-frontend", "--discovery", "file:///tmp/kv"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: Dynamo's frontend needs dynamo, which is not installed here: python3 -m dynamo_nb install dynamo"
    ]


@pytest.mark.processes
@pytest.mark.skipif(extra_installed("dynamo"), reason="Dynamo's packages are installed here")
def test_without_dynamo_the_flag_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "components/echo_worker.py", "--runtime", "dynamo", "--discovery", f"file://{tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --runtime dynamo needs dynamo, which is not installed here: python3 -m dynamo_nb install dynamo"
    )


@pytest.mark.dynamo
@pytest.mark.processes
def test_the_kits_dynamo_frontend_command_refuses_a_host_off_loopback_unless_allowed() -> None:
    import subprocess

    command = [sys.executable, "-m", "dynamo_nb", "dynamo-frontend", "--discovery", "file:///tmp/kv",
               "--http-host", "198.18.0.9"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "would listen on 198.18.0.9" in done.stderr and "keep --http-host on loopback" in done.stderr


async def our_text(hf_engine: Any, tiny_path: Path) -> str:
    """The greedy answer of the kit's runtime and frontend, in this process."""
    runtime = await DistributedRuntime.create()
    try:
        await serve_llm(
            runtime.endpoint("ours.backend.generate"), hf_engine.generate, tiny_path, model_name=MODEL
        )
        frontend = await Frontend.start(runtime, port=0)
        try:
            await frontend.wait_for_model(MODEL, timeout=30)
            async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
                answer = await http.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["choices"][0]["message"]["content"])
        finally:
            await frontend.stop()
    finally:
        await runtime.shutdown()


async def on_dynamo(program: str, where: str, tmp_path: Path, *flags: str, name: str | None = None) -> Any:
    """``program`` with ``--runtime dynamo`` over the discovery ``where`` and ``flags``, once ready."""
    return await launch(program, "--runtime", "dynamo", "--discovery", where, *flags,
                        cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=120, name=name)  # fmt: skip


async def wait_for_prefill_router(frontend: Any) -> None:
    """Until Dynamo's frontend has taken the prefill worker into its prefill router (it logs when)."""
    for _ in range(600):
        if any("Prefill router target activated" in line for line in frontend.process.logs()):
            return
        await asyncio.sleep(0.05)


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_hf_worker_on_dynamos_runtime_answers_behind_dynamos_frontend_over_a_folder(
    tmp_path: Path, hf_engine: Any, tiny_path: Path
) -> None:
    """hf_worker.py with --runtime dynamo over file discovery (see `check_hf_on_dynamo`)."""
    await check_hf_on_dynamo(f"file://{tmp_path / 'kv'}", tmp_path, await our_text(hf_engine, tiny_path))


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_hf_worker_on_dynamos_runtime_answers_behind_dynamos_frontend_over_etcd(
    services: Any, tmp_path: Path, hf_engine: Any, tiny_path: Path
) -> None:
    """hf_worker.py with --runtime dynamo over etcd (see `check_hf_on_dynamo`)."""
    await check_hf_on_dynamo(services.etcd_url, tmp_path, await our_text(hf_engine, tiny_path))


async def check_hf_on_dynamo(where: str, tmp_path: Path, expected: str) -> None:
    """hf_worker.py with --runtime dynamo, listed and served by python -m dynamo.frontend: the
    greedy text of the kit's own runtime and frontend, and a bad request is Dynamo's 400."""
    worker = await on_dynamo("components/hf_worker.py", where, tmp_path)
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        assert any("Dynamo's runtime: discovery" in line for line in worker.logs()), worker.tail()
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="none")
        answer = await client.chat.completions.create(**CHAT)
        assert answer.choices[0].message.content == expected
        assert answer.usage is not None and answer.usage.completion_tokens == CHAT["max_tokens"]
        async with httpx.AsyncClient(base_url=frontend.url, timeout=30) as http:
            bad = await http.post("/v1/chat/completions", json={**CHAT, "temperature": 7})
        assert bad.status_code == 400, bad.text
        await client.close()
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_mocker_on_dynamos_runtime_streams_behind_dynamos_frontend(tmp_path: Path) -> None:
    """mocker_worker.py with --runtime dynamo: Dynamo's frontend streams its tokens, as many as asked."""
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo("components/mocker_worker.py", where, tmp_path, "--speedup-ratio", "50")
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="none")
        stream = await client.chat.completions.create(**{**CHAT, "max_tokens": 9}, stream=True)
        pieces = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
        assert text and pieces[-1].choices[-1].finish_reason == "length"
        await client.close()
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()


async def answer_of(url: str, body: dict[str, Any]) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


@pytest.mark.dynamo
@pytest.mark.processes
@pytest.mark.parametrize(
    ("notebook", "model"),
    [("notebooks/10_your_own_engine.ipynb", "taboo"), ("notebooks/02_serving_an_llm.ipynb", MODEL)],
    ids=["10-own-engine", "02-hf"],
)
async def test_a_notebooks_engine_gives_the_same_text_on_both_runtimes(
    notebook: str, model: str, tmp_path: Path
) -> None:
    """A notebook's EngineProgram, exported: on the kit's runtime behind the kit's frontend, and
    with --runtime dynamo behind Dynamo's frontend, the same greedy text."""
    body = {**CHAT, "model": model}
    ours_folder, theirs_folder = f"file://{tmp_path / 'ours'}", f"file://{tmp_path / 'theirs'}"
    ours = await launch(notebook, "--discovery", ours_folder, cwd=ROOT, log_dir=tmp_path, show_logs=False,
                        timeout=180, name="ours")  # fmt: skip
    runtime = await DistributedRuntime.create(ours_folder, "tcp")
    frontend = await Frontend.start(runtime, port=0)
    try:
        await frontend.wait_for_model(model, timeout=60)
        expected = await answer_of(frontend.url, body)
    finally:
        await frontend.stop()
        await runtime.shutdown()
        assert await ours.stop(timeout=30) == 0, ours.tail()
    theirs = await launch(notebook, "--runtime", "dynamo", "--discovery", theirs_folder, cwd=ROOT,
                          log_dir=tmp_path, show_logs=False, timeout=180, name="theirs")  # fmt: skip
    dynamo = await launch_dynamo_frontend(theirs_folder, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(dynamo.url, model, timeout=60)
        assert await answer_of(dynamo.url, body) == expected
    finally:
        assert await dynamo.stop() == 0, dynamo.process.tail()
        assert await theirs.stop(timeout=30) == 0, theirs.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_a_client_that_leaves_stops_the_engine_on_dynamos_runtime(tmp_path: Path) -> None:
    """A streaming client of Dynamo's frontend that disconnects: the worker on Dynamo's runtime
    closes the engine's stream (its log says so) long before the 900 tokens asked for."""
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo("components/mocker_worker.py", where, tmp_path)
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        body = {**CHAT, "max_tokens": 900, "stream": True}
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
                assert answer.status_code == 200
                lines = answer.aiter_lines()
                for _ in range(3):
                    await anext(lines)
        # the connection is closed: the engine's stream must be closed too
        for _ in range(200):
            if any("stopped by its caller" in line for line in worker.logs()):
                break
            await asyncio.sleep(0.05)
        assert any("stopped by its caller" in line for line in worker.logs()), worker.tail()
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()


DYNAMO_CLIENT = """
import asyncio, json, os, sys
from dynamo.runtime import DistributedRuntime

async def main():
    runtime = DistributedRuntime(asyncio.get_running_loop(), os.environ["DYN_DISCOVERY_BACKEND"], "tcp")
    client = await runtime.endpoint(sys.argv[1]).client()
    await asyncio.wait_for(client.wait_for_instances(), 30)
    request = json.loads(sys.argv[2])
    if sys.argv[3:] == ["each"]:  # every instance's answer, by instance
        answers = [[i.data() async for i in await client.direct(request, iid)] for iid in client.instance_ids()]
        print(json.dumps(answers))
    else:
        print(json.dumps([item.data() async for item in await client.generate(request)]))
    runtime.shutdown()

asyncio.run(main())
"""


async def ask_with_dynamos_client(
    where: str,
    endpoint: str,
    request: dict[str, Any],
    *,
    each: bool = False,
    nats_url: str | None = None,
    host: Any = None,
) -> list[Any]:
    """The items of ``request`` to ``endpoint``, asked by a program that uses only Dynamo's own
    Python client (over the discovery ``where``); ``each``: every instance's items, a list each;
    ``host``: a `dynamo_nb.testing.hosts.Host` to run it on (answers come back to its address)."""
    tcp_host = None if host is None else host.address
    planes = DynamoPlanes.from_flags(where, None, nats_url, tcp_host=tcp_host, allow_unauthenticated=True)
    command = [
        sys.executable,
        "-c",
        DYNAMO_CLIENT,
        endpoint,
        json.dumps(request),
        *(["each"] if each else []),
    ]
    client = await asyncio.create_subprocess_exec(
        *(command if host is None else host.wrap(command)), env={**os.environ, **planes.environment},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(client.communicate(), 60)
    assert client.returncode == 0, err.decode()[-2000:]
    return list(json.loads(out.decode().strip().splitlines()[-1]))


@pytest.mark.dynamo
@pytest.mark.processes
@pytest.mark.parametrize(
    ("program", "endpoint", "text"),
    [
        ("components/echo_worker.py", "dynamo.echo.generate", "one two three"),
        ("notebooks/01_runtime_basics.ipynb", "tutorial.words.generate", "from a notebook"),
    ],
    ids=["echo-worker", "01-handler-program"],
)
async def test_a_handler_on_dynamos_runtime_answers_dynamos_own_client(
    program: str, endpoint: str, text: str, tmp_path: Path
) -> None:
    """echo_worker.py, and notebook 01's HandlerProgram (exported), with --runtime dynamo: a
    program using only Dynamo's Python client (no kit import) gets the handler's items."""
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo(program, where, tmp_path)
    try:
        items = await ask_with_dynamos_client(where, endpoint, {"text": text})
        assert [item["word"] for item in items] == text.split()
    finally:
        assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_an_hf_prefill_and_decode_on_dynamos_runtime_give_the_aggregated_text(
    tmp_path: Path, hf_engine: Any, tiny_path: Path
) -> None:
    """hf prefill + decode workers on Dynamo's runtime behind Dynamo's frontend (its own
    frontend-based prefill routing: both legs at once, with bootstrap_info): the aggregated
    greedy text, and the prefill's bootstrap server handed each request's KV to the decode."""
    expected = await our_text(hf_engine, tiny_path)
    where = f"file://{tmp_path / 'kv'}"
    prefill, decode = await asyncio.gather(*(
        on_dynamo("components/hf_worker.py", where, tmp_path, "--mode", mode, name=mode) for mode in ("prefill", "decode")
    ))  # fmt: skip
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        await wait_for_prefill_router(frontend)
        for _ in range(2):
            assert await answer_of(frontend.url, CHAT) == expected
        [stats] = await ask_with_dynamos_client(where, "dynamo.prefill.stats", {})
        assert stats["kv_served"] == 2 and stats["bootstrap_rooms"] == 0, stats  # both fetched, none left
        assert not any("wrong or missing bootstrap_token" in line for line in decode.logs()), decode.tail()
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        for worker in (decode, prefill):
            assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_dynamos_kv_router_sends_a_repeated_prompt_to_the_worker_that_holds_it(
    services: Any, tmp_path: Path
) -> None:
    """Two hf workers on Dynamo's runtime publish their prefix caches' KV events to Dynamo's KV
    publisher over NATS (its ZMQ plane would listen on every interface); python -m dynamo.frontend
    --router-mode kv sends each repeat of a long prompt to the worker that holds it, whose prefix
    cache reports the hit (cached_tokens > 0), where round robin would send every other repeat to
    a worker that holds nothing."""
    where, nats = f"file://{tmp_path / 'kv'}", str(services.nats_url)
    workers = await asyncio.gather(
        *(
            on_dynamo("components/hf_worker.py", where, tmp_path, "--nats-url", nats, name=f"hf{i}")
            for i in range(2)
        )
    )
    frontend = await launch_dynamo_frontend(
        where, "--router-mode", "kv", nats_url=nats, log_dir=tmp_path, show_logs=False, timeout=120
    )
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        prompt = " ".join(f"line {i}: the harbour keeps its ships in rows" for i in range(12))
        body = {**CHAT, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
        cached = []
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            for attempt in range(4):
                answer = await http.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                cached.append(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
                if attempt == 0:  # the holder handed its blocks to Dynamo's publisher (asked by
                    # Dynamo's own client: a second process, by which time the event is delivered)
                    published = await ask_with_dynamos_client(
                        where, "dynamo.backend.stats", {}, each=True, nats_url=nats
                    )
                    assert sorted(s[0]["kv_blocks_published"] > 0 for s in published) == [False, True], (
                        published
                    )
        assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        for worker in workers:
            assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_a_mocker_prefill_and_decode_on_dynamos_runtime_stream_the_aggregated_tokens(
    tmp_path: Path,
) -> None:
    """mocker_worker.py as a prefill + decode pair on Dynamo's runtime: Dynamo's frontend takes its
    prefill route (its router's metrics count the prefill legs) and the text equals an aggregated
    mocker's, behind the same kind of frontend."""
    body = {**CHAT, "max_tokens": 8}
    texts = {}
    for layout, modes in (("aggregated", ["aggregated"]), ("pair", ["prefill", "decode"])):
        where = f"file://{tmp_path / layout}"
        workers = await asyncio.gather(*(
            on_dynamo("components/mocker_worker.py", where, tmp_path, "--mode", mode, "--speedup-ratio", "50", name=mode)
            for mode in modes
        ))  # fmt: skip
        frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
        try:
            await bench.wait_for_model(frontend.url, MODEL, timeout=60)
            if layout == "pair":
                await wait_for_prefill_router(frontend)
            texts[layout] = [await answer_of(frontend.url, body) for _ in range(2)]
            if layout == "pair":
                metrics = await bench.scrape_metrics(frontend.url)
                legs = metrics[(metrics["name"] == "dynamo_component_router_input_sequence_tokens_count")
                               & (metrics["phase"] == "prefill")]  # fmt: skip
                assert int(legs["value"].sum()) == 2, legs
        finally:
            assert await frontend.stop() == 0, frontend.process.tail()
            for worker in workers:
                assert await worker.stop(timeout=30) == 0, worker.tail()
    assert texts["pair"] == texts["aggregated"] and texts["pair"][0], texts


BROKEN_ENGINE = '''
"""A mocker whose stream raises after three items: a bug in the engine."""
import sys
from dynamo_nb import EngineProgram
from dynamo_nb.engines.mocker import MockerEngine


class Broken(MockerEngine):
    async def generate(self, request, context=None):
        sent = 0
        async for item in super().generate(request, context):
            if sent == 3:
                raise TypeError("broken on purpose")
            yield item
            sent += 1


worker = EngineProgram(Broken)
if __name__ == "__main__":
    sys.exit(worker.run())
'''


@pytest.mark.dynamo
@pytest.mark.processes
async def test_an_engines_bug_on_dynamos_runtime_is_a_500_and_the_worker_log_names_it(tmp_path: Path) -> None:
    """An exception in the engine mid-stream: Dynamo's frontend answers 500 (its own words: it
    withholds a 5xx's message), not 400 "Invalid request"; the worker's log names the exception,
    the worker and the request id the client can see (the chunks' ``chatcmpl-<id>``)."""
    program = tmp_path / "broken.py"
    program.write_text(BROKEN_ENGINE)
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo(str(program), where, tmp_path, "--speedup-ratio", "20")
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, instances=1, timeout=60)
        body = {**CHAT, "max_tokens": 10}
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            unary = await http.post("/v1/chat/completions", json=body)
            assert unary.status_code == 500 and "Invalid request" not in unary.text, unary.text
            async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
                lines = [line async for line in answer.aiter_lines()]
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        error = events[-1]["error"]
        assert (error["code"], error["type"]) == (500, "internal_server_error"), events
        request_id = events[0]["id"].removeprefix("chatcmpl-")
        for _ in range(100):  # the log line may come a moment after the answer
            failed = [
                line for line in worker.logs() if "the worker failed: TypeError: broken on purpose" in line
            ]
            if len(failed) >= 2:
                break
            await asyncio.sleep(0.05)
        assert any(
            f"request {request_id}" in line and "of dynamo.backend.generate" in line for line in failed
        ), worker.tail()
        assert any('raise TypeError("broken on purpose")' in line for line in worker.logs())  # its traceback
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()


def listening_addresses(pid: int) -> list[str]:
    """The addresses process ``pid`` listens on (TCP, from /proc: its sockets' inodes)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw, port = fields[1].split(":")
            packed = bytes.fromhex(raw)
            words = b"".join(
                packed[i : i + 4][::-1] for i in range(0, len(packed), 4)
            )  # each 32-bit word host-order
            host = str(ipaddress.ip_address(words)) if width == 8 else str(ipaddress.IPv6Address(words))
            found.append(f"{host}:{int(port, 16)}")
    return found


def is_loopback_address(address: str) -> bool:
    host = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(host, "ipv4_mapped", None)
    return host.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.dynamo
@pytest.mark.processes
async def test_a_worker_on_dynamos_runtime_listens_only_on_loopback_unless_allowed(tmp_path: Path) -> None:
    """With default flags nothing listens off loopback (its KV events stay unpublished, saying why),
    and --system-port's system server listens on loopback too, its /health ready once the worker
    serves; --tcp-host 0.0.0.0 without --allow-unauthenticated is one line and exit 2; with it
    Dynamo's ZMQ publisher's listener on every interface appears."""
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo("components/mocker_worker.py", where, tmp_path, name="default")
    try:
        addresses = listening_addresses(worker.pid)
        assert addresses and all(is_loopback_address(a) for a in addresses), addresses
        assert any("KV events are not published" in line and "--nats-url" in line for line in worker.logs())
    finally:
        assert await worker.stop(timeout=30) == 0, worker.tail()
    port = free_port(bound_later=True)  # below 32768: Dynamo reads the port as an i16
    worker = await on_dynamo(
        "components/mocker_worker.py", where, tmp_path, "--system-port", str(port), name="system"
    )
    try:
        addresses = listening_addresses(worker.pid)
        assert f"127.0.0.1:{port}" in addresses, addresses
        assert all(is_loopback_address(a) for a in addresses), addresses
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            health = await http.get("/health")  # READY came after the endpoint was served
        assert (health.status_code, health.json()["status"]) == (200, "ready"), health.text
    finally:
        assert await worker.stop(timeout=30) == 0, worker.tail()
    refused = await asyncio.create_subprocess_exec(
        sys.executable, "components/mocker_worker.py", "--runtime", "dynamo", "--discovery", where,
        "--tcp-host", "0.0.0.0", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(refused.communicate(), 60)
    assert refused.returncode == 2, err.decode()
    assert (
        err.decode()
        .strip()
        .splitlines()[-1]
        .startswith(
            "error: Dynamo's TCP request plane would listen on 0.0.0.0, and Dynamo's runtime has no cluster secret"
        )
    )
    allowed = await on_dynamo(
        "components/mocker_worker.py", where, tmp_path, "--allow-unauthenticated", name="open"
    )
    try:
        assert not all(is_loopback_address(a) for a in listening_addresses(allowed.pid))
    finally:
        assert await allowed.stop(timeout=30) == 0, allowed.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_frontend_command_a_worker_prints_serves_it(tmp_path: Path) -> None:
    """A --runtime dynamo worker logs the command that starts Dynamo's frontend for it, in the
    kit's short form and spelled out: each, run as printed (another port), lists and serves the
    model; the kit's own runtime, pointed at that folder, says which frontend to use instead."""
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo("components/mocker_worker.py", where, tmp_path, "--speedup-ratio", "20")
    try:
        line = next(line for line in worker.logs() if "Dynamo's frontend for this worker: " in line)
        kit, spelled = line.split("Dynamo's frontend for this worker: ", 1)[1].split("   (or, spelled out: ")
        for form, command in (("kit", kit), ("spelled", spelled.removesuffix(")"))):
            words = shlex.split(command.replace("--http-port 8000", f"--http-port {(port := free_port())}"))
            env = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
            program = [word for word in words if word not in {f"{k}={v}" for k, v in env.items()}]
            frontend = await launch(*program, env=env, cwd=ROOT, log_dir=tmp_path, show_logs=False, ready=None,
                                    timeout=120, name=f"frontend-{form}")  # fmt: skip
            try:
                url = f"http://127.0.0.1:{port}"
                await bench.wait_for_model(url, MODEL, instances=1, timeout=90)
                assert await answer_of(url, {**CHAT, "max_tokens": 4}), form
            finally:
                assert await frontend.stop(timeout=10) == 0, frontend.tail()
        with pytest.raises(ConfigError, match="NVIDIA Dynamo's discovery folder"):
            await DistributedRuntime.create(where)
    finally:
        assert await worker.stop(timeout=30) == 0, worker.tail()


def readme_dynamo_lines() -> list[str]:
    """The commands of the README's "On NVIDIA Dynamo" block, comments dropped."""
    section = (ROOT / "README.md").read_text().split("## On NVIDIA Dynamo", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_readmes_dynamo_lines_run_as_written(tmp_path: Path) -> None:
    """The README's worker and frontend lines, as written but for the folder (the test's own) and
    the port (a free one): Dynamo's frontend lists the worker and answers."""
    install, worker_line, frontend_line = readme_dynamo_lines()
    assert install.startswith("python3 -m pip install -e . && python3 -m dynamo_nb install dynamo")
    ours = {"/tmp/kv": str(tmp_path / "kv"), "--http-port 8000": f"--http-port {(port := free_port())}"}
    words = []
    for line in (worker_line.removesuffix("&"), frontend_line):
        for theirs, mine in ours.items():
            line = line.replace(theirs, mine)
        words.append(shlex.split(line))
    assert [command[0] for command in words] == ["python3", "python3"] and "--http-port" in words[1]
    worker = await launch(sys.executable, *words[0][1:], cwd=ROOT, log_dir=tmp_path, show_logs=False,
                          timeout=180, name="readme-worker")  # fmt: skip
    try:
        frontend = await launch(sys.executable, *words[1][1:], cwd=ROOT, log_dir=tmp_path, show_logs=False,
                                ready=None, timeout=120, name="readme-frontend")  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            await bench.wait_for_model(url, MODEL, instances=1, timeout=90)
            assert await answer_of(url, {**CHAT, "max_tokens": 4})
        finally:
            assert await frontend.stop(timeout=10) == 0, frontend.tail()
    finally:
        assert await worker.stop(timeout=30) == 0, worker.tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_the_dynamo_pages_python_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/dynamo.md's Python snippet, with its own imports (its folder /tmp/kv made the test's):
    the worker and Dynamo's frontend it starts answer."""
    from doc_snippets import run_snippets

    monkeypatch.chdir(ROOT)
    names = await run_snippets(ROOT / "docs" / "dynamo.md", folder=("/tmp/kv", str(tmp_path / "kv")))
    try:
        await bench.wait_for_model(names["frontend"].url, MODEL, instances=1, timeout=60)
        assert await answer_of(names["frontend"].url, {**CHAT, "max_tokens": 4})
    finally:
        assert await names["frontend"].stop() == 0, names["frontend"].process.tail()
        assert await names["worker"].stop(timeout=30) == 0, names["worker"].tail()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_a_running_server_behind_dynamos_frontend_through_the_upstream_worker(tmp_path: Path) -> None:
    """components/upstream_worker.py with --runtime dynamo: a running OpenAI-compatible server
    (the kit's own run --out hf, in its own process) behind Dynamo's frontend, the same text as
    the server asked directly."""
    port = free_port()
    server = await launch(sys.executable, "-m", "dynamo_nb", "run", "--in", "http", "--out", "hf", "--http-port", port,
                          cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=120, name="server")  # fmt: skip
    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo(
        "components/upstream_worker.py", where, tmp_path, "--upstream", f"http://127.0.0.1:{port}"
    )
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, instances=1, timeout=60)
        assert await answer_of(frontend.url, CHAT) == await answer_of(f"http://127.0.0.1:{port}", CHAT)
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()
        await server.stop(timeout=10)


ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"], "additionalProperties": False}  # fmt: skip


@pytest.mark.dynamo
@pytest.mark.processes
async def test_agent_clients_behind_dynamos_frontend(tmp_path: Path) -> None:
    """hf_worker.py on Dynamo's runtime with ``--dyn-tool-call-parser hermes``, behind python -m
    dynamo.frontend: Dynamo's frontend renders the tools and parses the calls; the worker enforces
    the grammar Dynamo's frontend asks for (its ``sampling_options.guided_decoding``), so JSON-schema
    answers validate and a forced call (required, named) carries valid arguments; the Responses
    and (``--enable-anthropic-api``) Messages APIs answer from the kit's worker; a mocker, which
    enforces none, refuses such a request (a 400) instead of answering unconstrained."""
    import anthropic
    import jsonschema
    from helpers import random_schema
    from openai import AsyncOpenAI

    where = f"file://{tmp_path / 'kv'}"
    worker = await on_dynamo("components/hf_worker.py", where, tmp_path, "--dyn-tool-call-parser", "hermes")
    mocker = await on_dynamo("components/mocker_worker.py", where, tmp_path, "--model-name", "mock",
                             "--endpoint", "dynamo.mocker.generate")  # fmt: skip
    frontend = await launch_dynamo_frontend(
        where, "--enable-anthropic-api", log_dir=tmp_path, show_logs=False, timeout=120
    )
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        await bench.wait_for_model(frontend.url, "mock", timeout=60)
        async with AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="none", max_retries=0) as client:
            # the Responses API and (--enable-anthropic-api) the Messages API, served by Dynamo's frontend
            response = await client.responses.create(model=MODEL, input="Hello!", max_output_tokens=8)
            assert response.output_text and response.usage is not None, response
            async with anthropic.AsyncAnthropic(
                base_url=frontend.url, api_key="none", max_retries=0
            ) as claude:
                message = await claude.messages.create(model=MODEL, max_tokens=8, messages=CHAT["messages"])  # type: ignore[arg-type]
            assert message.content and message.content[0].type == "text" and message.stop_reason, message
            draw = __import__("random").Random(11)
            for seed in range(5):
                schema = random_schema(draw)
                answer = await client.chat.completions.create(
                    model=MODEL, messages=CHAT["messages"], max_tokens=120, temperature=1.0, seed=seed,  # type: ignore[arg-type]
                    response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}},
                )  # fmt: skip
                jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
            tools: Any = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
            for choice in ("required", {"type": "function", "function": {"name": "add"}}):
                called = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=tools,
                    tool_choice=choice, max_tokens=80, temperature=0,  # type: ignore[arg-type]
                )  # fmt: skip
                # required: Dynamo asks for a JSON array of calls, one or more (the tiny model may go on
                # adding calls until max_tokens); named: the function's arguments, one call
                calls = called.choices[0].message.tool_calls or []
                assert calls and (choice == "required" or len(calls) == 1), called
                for call in calls:
                    assert call.function.name == "add", called  # type: ignore[union-attr]
                    jsonschema.validate(json.loads(call.function.arguments), ADD)  # type: ignore[union-attr]
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            refused = await http.post("/v1/chat/completions", json={
                "model": "mock", "messages": CHAT["messages"], "max_tokens": 8,
                "response_format": {"type": "json_object"}})  # fmt: skip
        assert refused.status_code == 400, refused.text  # in Dynamo's words ("Bad Request"); the log says why
        assert any("does not enforce structured output" in line for line in mocker.logs()), mocker.tail()
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        assert await worker.stop(timeout=30) == 0, worker.tail()
        assert await mocker.stop(timeout=30) == 0, mocker.tail()


async def test_dynamos_tool_call_parser_flag_is_refused_on_the_kits_runtime() -> None:
    from dynamo_nb.runtime.program import RuntimeConfig

    with pytest.raises(ConfigError, match="start the frontend with --tool-call-parser"):
        await RuntimeConfig(dyn_tool_call_parser="hermes").start_kit()


@pytest.mark.dynamo
@pytest.mark.processes
async def test_dynamos_own_mocker_runs_on_a_profile_the_kit_wrote(tmp_path: Path) -> None:
    """A profile written by the kit (`TimingProfile.write`) drives NVIDIA Dynamo 1.6.1's own mocker
    (``python -m dynamo.mocker --planner-profile-data``, its one-file tables) behind Dynamo's frontend."""
    from dynamo_nb.engines.mocker_timing import TimingProfile
    from dynamo_nb.models import tiny_model_path

    profile = TimingProfile(prefill=[(t, 0.02 * t + 3) for t in (16, 64, 256)],
                            decode=[(b, c, 1 + 0.1 * b + 0.001 * b * c) for b in (1, 8) for c in (64.0, 256.0)])  # fmt: skip
    folder = profile.write(tmp_path / "profile")
    where = f"file://{tmp_path / 'kv'}"
    env = {**os.environ, **DynamoPlanes.from_flags(where, None, None, tcp_host=None).environment}
    log = (tmp_path / "dynamo-mocker.log").open("wb")
    mocker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dynamo.mocker", "--model-path", str(tiny_model_path()), "--model-name", MODEL,
        "--planner-profile-data", str(folder / "perf_data.npz"), env=env, stdout=log, stderr=log,
    )  # fmt: skip
    frontend = await launch_dynamo_frontend(where, log_dir=tmp_path, show_logs=False, timeout=120)
    try:
        await bench.wait_for_model(frontend.url, MODEL, timeout=60)
        async with httpx.AsyncClient(base_url=frontend.url, timeout=60) as http:
            answer = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 5}
            )
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5, answer.text
        said = (tmp_path / "dynamo-mocker.log").read_text(errors="replace")
        assert "Loaded performance model: prefill_points=100, decode_grid=100x100" in said, said[-2000:]
    finally:
        assert await frontend.stop() == 0, frontend.process.tail()
        mocker.terminate()
        await asyncio.wait_for(mocker.wait(), 30)
        log.close()
